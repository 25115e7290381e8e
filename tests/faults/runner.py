"""Executes a fault schedule (tests/faults/schedule.py) against real processes, then checks the run.

A private Mosquitto from broker-config/, `npcsim run` shard processes (one of them in a
network namespace or behind the fault proxy when the schedule says so), `npcsim worker`s
when it has worker faults, the fake OpenAI-compatible server when it has model faults, a
subscriber with a persistent session connected before the first shard starts, and a
publisher of the schedule's outside inputs and world-state changes. Every fault and input
waits until every shard has begun its tick (their stores' committed tick); faults run one
after another. Everything started is stopped and everything made is removed at the end,
however the schedule ends.

The checks (`Outcome.problems`, each the first difference of its kind):
- every shard ends with exit 0 at the last tick;
- infrastructure faults only: the audit set equals the calm run's (tests/faults/calm.py),
  or the earliest record that differs is named;
- model faults: every line said has an audit record, every record replays byte for byte,
  every record has a line;
- every input the broker acknowledged is in exactly one store and answered by its NPC;
- the subscriber received every line said, once after de-duplication by inference id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import httpx

from sim.audit import AuditRecord, replay
from sim.scenario import load_scenario
from sim.store import open_reader
from sim.wire import topics
from sim.wire.events import decode_say
from tests.fake_openai import FakeOpenAI, open_fake_openai
from tests.faults.calm import AuditSet, audit_set, calm_run, recorded_inputs, world_ticks
from tests.faults.network import FaultProxy, Netns, fault_proxy, netns
from tests.faults.schedule import (
    BROKER_KILL,
    INFRA,
    MODEL_500,
    MODEL_HANG,
    MODEL_SLOW,
    PARTITION,
    PROXY_RESET,
    PROXY_STALL,
    SHARD_KILL,
    WORKER_KILL,
    Fault,
    Input,
    Schedule,
    WorldChange,
)
from tests.helpers import VILLAGE, MosquittoProcess, eventually, free_port, generated_world, start_npcsim

__all__ = ["Outcome", "run_schedule"]

TICK_MS = 500
WORKER_HOLD_S = 5.0  # how long a worker kill waits for the worker to hold a request (then kills anyway)
LIVE_S = 180.0  # how long a condition on a live run may take (the machine is shared)
INFERENCE_TIMEOUT_S = 3.0
SLOW_LINK_S = 0.01  # the proxied shard's link is slow all along: each chunk, each way, this much later
DELIVERY_S = 0.1  # loopback: the broker has delivered an acknowledged input to a connected shard by then
LATE = 3  # no step is taken once a shard committed this many ticks before the end (none would answer)


@dataclass
class Outcome:
    schedule: Schedule
    faults: int = 0
    shard_kills: int = 0
    inputs_acked: int = 0
    inputs_lost: int = 0
    records: int = 0
    skipped: int = 0  # steps not taken: the run was over before their turn came
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def holding_requests(port: int, *, within: float) -> bool:
    """Until the worker whose metrics are on `port` is serving a request (its in-flight gauge above
    0), so that a kill lands mid-inference; False when it served none in `within` seconds."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=1.0) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                text = (await client.get("/metrics")).text
                if any(line.startswith("npcsim_inferences_in_flight ") and float(line.split()[1]) > 0
                       for line in text.splitlines()):
                    return True
            await asyncio.sleep(0.005)  # the poll's interval
    return False


def committed_tick(db: Path) -> int:
    if not db.exists():
        return -1
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'last_tick'").fetchone()
    except sqlite3.Error:
        return -1
    return -1 if row is None else int(row[0])


class Subscriber:
    """A persistent session on every `say` and `status` topic of the run, reconnecting at once."""

    def __init__(self, port: int, run: str) -> None:
        self.port, self.run = port, run
        self.said: dict[str, int] = {}  # inference id -> times received
        self.status_at: dict[str, float] = {}  # shard -> when its status was last received
        self.connected = asyncio.Event()

    async def serve(self) -> None:
        while True:
            try:
                async with aiomqtt.Client("127.0.0.1", self.port, identifier=f"faults-{self.run}",
                                          clean_session=False, keepalive=5) as client:
                    root = topics.run_root(self.run)
                    await client.subscribe(f"{root}/agent/+/say", qos=1)
                    await client.subscribe(f"{root}/status/+", qos=1)
                    self.connected.set()
                    async for message in client.messages:
                        self._take(str(message.topic), bytes(message.payload))
            except aiomqtt.MqttError:
                self.connected.clear()
                await asyncio.sleep(0.05)  # the poll's interval while the broker is away

    def _take(self, topic: str, payload: bytes) -> None:
        if topic.endswith("/say"):
            said = decode_say(payload)
            self.said[said.inference_id] = self.said.get(said.inference_id, 0) + 1
        elif "/status/" in topic:
            self.status_at[topic.rsplit("/", 1)[1]] = time.monotonic()


async def publish(port: int, topic: str, payload: bytes, *, retain: bool = False) -> None:
    """Published at QoS 1 and acknowledged by the broker; retried while the broker is away."""
    while True:
        try:
            async with aiomqtt.Client("127.0.0.1", port) as client:
                await client.publish(topic, payload, qos=1, retain=retain)
                return
        except aiomqtt.MqttError:
            await asyncio.sleep(0.05)  # the poll's interval while the broker is away


@dataclass
class ShardProcess:
    index: int
    db: Path
    logs: list[Path]
    proc: asyncio.subprocess.Process | None = None


class Run:
    """The processes of one schedule and what acts on them."""

    def __init__(self, schedule: Schedule, workdir: Path, broker: MosquittoProcess, run_id: str) -> None:
        self.s, self.workdir, self.broker, self.run_id = schedule, workdir, broker, run_id
        self.scenario = VILLAGE if schedule.world == "village" else generated_world(workdir)
        self.npcs = sorted(n.id for n in load_scenario(self.scenario).npcs)
        self.shards = [ShardProcess(i, workdir / f"shard{i}.db", []) for i in range(schedule.shards)]
        self.workers: list[asyncio.subprocess.Process] = []
        self.worker_metrics: list[int] = []  # each worker's --metrics-port: what tells it holds requests
        self.model: FakeOpenAI | None = None
        self.ns: Netns | None = None
        self.proxy: FaultProxy | None = None
        self.subscriber = Subscriber(broker.port, run_id)
        self.acked: list[tuple[str, str, str]] = []  # (player, npc, text) the broker acknowledged
        self.outcome = Outcome(schedule)

    def broker_url(self, index: int) -> str:
        if self.ns is not None and self._net_target(index):
            return f"mqtt://{self.ns.host_addr}:{self.broker.port}"
        if self.proxy is not None and self._net_target(index):
            return f"mqtt://127.0.0.1:{self.proxy.port}"
        return self.broker.url

    def _net_target(self, index: int) -> bool:
        return any(f.target == index for f in self.s.faults if f.kind in (PARTITION, PROXY_RESET, PROXY_STALL))

    async def start_shard(self, shard: ShardProcess, *, resume: bool) -> None:
        log = self.workdir / f"shard{shard.index}-{len(shard.logs)}.log"
        shard.logs.append(log)
        extra: list[str] = ["--resume"] if resume else []
        if self.model is not None:
            extra += ["--backend", "openai", "--base-url", self.model.base_url,
                      "--set", f"inference.inference_timeout={INFERENCE_TIMEOUT_S}",
                      "--set", f"inference.backend_options.read_timeout={INFERENCE_TIMEOUT_S / 2}"]
        if self.s.workers:
            extra += ["--remote-workers"]
        wrap = self.ns.wrap if self.ns is not None and self._net_target(shard.index) else ()
        with log.open("wb") as err:
            shard.proc = await start_npcsim(
                "run", self.scenario, "--broker", self.broker_url(shard.index), "--run-id", self.run_id,
                "--shard", f"{shard.index}/{self.s.shards}", "--until-tick", str(self.s.ticks),
                "--tick-ms", str(TICK_MS), "--db", str(shard.db), "--quiet", *extra,
                stdout=asyncio.subprocess.DEVNULL, stderr=err, wrap=wrap,
            )

    async def start_worker(self, *, ready: bool = True) -> None:
        """One more `npcsim worker`, waited for (`ready`) until it says it is subscribed: before
        the shards start, since a request sent while no worker is subscribed is lost to the
        shared subscription; not after a kill, when the other worker serves meanwhile."""
        log = self.workdir / f"worker{len(self.workers)}.log"
        port = free_port()
        with log.open("wb") as out:
            proc = await start_npcsim(
                "worker", "--broker", self.broker.url, "--run", self.run_id,
                "--set", "inference.backend_options.delay_ms=40",
                "--name", f"w{len(self.workers)}", "--metrics-port", str(port), stdout=out, stderr=out,
            )
        self.workers.append(proc)
        self.worker_metrics.append(port)
        if not ready:
            return
        await eventually(lambda: b" ready: " in log.read_bytes() or proc.returncode is not None,
                         what=f"worker {len(self.workers) - 1} ready", within=LIVE_S)
        assert proc.returncode is None, f"worker ended at start: {log.read_text(errors='replace')[-800:]}"

    def ticks(self) -> list[int]:
        return [committed_tick(s.db) for s in self.shards]

    async def begun(self, tick: int) -> None:
        """Until every shard has committed tick-1 (so each is in tick `tick`, or done)."""
        await eventually(lambda: min(self.ticks()) >= tick - 1, what=f"every shard beginning tick {tick}",
                         within=LIVE_S)

    async def reconnected(self, since: float) -> None:
        """Until the subscriber is back and every shard published its status after `since`."""
        await eventually(self.subscriber.connected.is_set, what="the subscriber reconnecting", within=LIVE_S)
        await eventually(
            lambda: all(self.subscriber.status_at.get(str(s.index), 0) > since for s in self.shards
                        if min(self.ticks()) < self.s.ticks - 1),
            what="every shard publishing its status again", within=LIVE_S,
        )

    # --- what the schedule does ----------------------------------------------------------

    async def send_input(self, item: Input) -> None:
        npc = self.npcs[item.to % len(self.npcs)]
        body = json.dumps({"to": npc, "text": item.text}).encode()
        await publish(self.broker.port, topics.player_input(self.run_id, item.player), body)
        self.acked.append((item.player, npc, item.text))

    async def send_world(self, change: WorldChange) -> None:
        body = json.dumps({"state": {change.key: change.value}}).encode()
        await publish(self.broker.port, topics.world_state(self.run_id), body, retain=True)

    async def inject(self, fault: Fault, kill_inputs: list[Input]) -> None:
        self.outcome.faults += 1
        began = time.monotonic()
        if fault.kind == BROKER_KILL:
            await asyncio.to_thread(self.broker.kill)
            await asyncio.sleep(fault.duration_s)  # the subject: the broker away this long
            await asyncio.to_thread(self.broker.start)
            await self.reconnected(began)
        elif fault.kind == SHARD_KILL:
            shard = self.shards[fault.target]
            for item in kill_inputs:  # in the tick the shard is killed in
                await self.send_input(item)
            if kill_inputs:
                await asyncio.sleep(DELIVERY_S)  # the subject: the input delivered, the tick not yet over
            assert shard.proc is not None
            if shard.proc.returncode is None:
                shard.proc.kill()  # kill -9
                await shard.proc.wait()
                self.outcome.shard_kills += 1
            await asyncio.sleep(fault.duration_s)  # the subject: the shard away this long
            await self.start_shard(shard, resume=True)
            await self.reconnected(began)
        elif fault.kind == WORKER_KILL:
            alive = [(w, port) for w, port in zip(self.workers, self.worker_metrics, strict=True)
                     if w.returncode is None]
            if alive:
                doomed, port = alive[0]
                await holding_requests(port, within=WORKER_HOLD_S)
                doomed.kill()  # kill -9, with inferences in flight (each takes 40 ms)
                await doomed.wait()
            await asyncio.sleep(fault.duration_s)  # the subject: one worker fewer this long
            await self.start_worker(ready=False)
        elif fault.kind == PARTITION:
            assert self.ns is not None
            self.ns.link(up=False)
            try:
                await asyncio.sleep(fault.duration_s)  # the subject: the shard cut off this long
            finally:
                self.ns.link(up=True)
            await self.reconnected(began)
        elif fault.kind == PROXY_RESET:
            assert self.proxy is not None
            self.proxy.reset()
            await self.reconnected(began)
        elif fault.kind == PROXY_STALL:
            assert self.proxy is not None
            await self.proxy.stall(fault.duration_s)
        else:
            assert self.model is not None
            if fault.kind == MODEL_SLOW:
                self.model.delay_s = INFERENCE_TIMEOUT_S / 10
            else:
                self.model.default = "500" if fault.kind == MODEL_500 else "hang"
            await asyncio.sleep(fault.duration_s)  # the subject: the model server failing this long
            self.model.default, self.model.delay_s = "ok", 0.0
            if fault.kind == MODEL_HANG:
                await self.model.close_handlers()

    async def drive(self) -> None:
        """The schedule's inputs, world changes and faults, in tick order, each once its tick began."""
        kills = {f.tick for f in self.s.faults if f.kind == SHARD_KILL}

        def at_kill(i: Input) -> bool:
            return i.tick in kills and i.player.startswith("k")

        steps: list[tuple[int, int, object]] = [(f.tick, 2, f) for f in self.s.faults]
        steps += [(i.tick, 0, i) for i in self.s.inputs if not at_kill(i)]
        steps += [(w.tick, 1, w) for w in self.s.world_changes]
        published = -1  # the tick of the last input or world change published
        for tick, _, step in sorted(steps, key=lambda x: (x[0], x[1])):
            await self.begun(tick)
            if max(self.ticks()) >= self.s.ticks - LATE:
                # a run no barrier holds (one shard, a worker away) went on during an earlier
                # fault: what is left would land after the run, where nobody takes it
                self.outcome.skipped += 1
                continue
            if isinstance(step, Fault):
                if published == tick:
                    await asyncio.sleep(DELIVERY_S)  # the subject: what was published in this tick delivered first
                await self.inject(step, [i for i in self.s.inputs if at_kill(i) and i.tick == step.tick])
                continue
            published = tick
            if isinstance(step, Input):
                await self.send_input(step)
            elif isinstance(step, WorldChange):
                await self.send_world(step)

    async def finish(self) -> None:
        for shard in self.shards:
            assert shard.proc is not None
            async with asyncio.timeout(LIVE_S):
                code = await shard.proc.wait()
            if code != 0:
                tail = shard.logs[-1].read_text(errors="replace")[-1500:]
                self.outcome.problems.append(f"shard {shard.index} exited {code}: {tail}")
        last = self.ticks()
        if any(t != self.s.ticks - 1 for t in last):
            self.outcome.problems.append(f"committed ticks {last}, expected {self.s.ticks - 1} on every shard")

    async def stop_all(self) -> None:
        for proc in [s.proc for s in self.shards] + self.workers:
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()

    # --- the checks ----------------------------------------------------------------------

    def lines_said(self) -> set[str]:
        """The inference ids of every line in the stores."""
        said: set[str] = set()
        for db in [s.db for s in self.shards if s.db.exists()]:
            with open_reader(db) as reader:
                said |= {r.id for r in reader.audit_records() if r.line}
        return said

    async def check(self) -> None:
        dbs = [s.db for s in self.shards if s.db.exists()]
        problems = self.outcome.problems
        got = audit_set(dbs)
        self.outcome.records = len(got)
        records: list[AuditRecord] = []
        for db in dbs:
            with open_reader(db) as reader:
                records += reader.audit_records()
        stored = recorded_inputs(dbs)
        texts = [row[4] for row in stored]
        lost = [a for a in self.acked if texts.count(a[2]) != 1]
        self.outcome.inputs_lost = sum(1 for a in self.acked if a[2] not in texts)
        self.outcome.inputs_acked = len(self.acked)
        if lost:
            problems.append(f"{len(lost)} acknowledged input(s) not stored exactly once, first {lost[0]}")
        answered = {(r.agent_id, r.player_input) for r in records}
        unanswered = [a for a in self.acked if a[2] in texts and (a[1], f"{a[0]}: {a[2]}") not in answered]
        if unanswered:
            problems.append(f"{len(unanswered)} stored input(s) not answered, first {unanswered[0]}")
        said = {r.id for r in records if r.line}
        received = set(self.subscriber.said)
        if said != received:
            missing, extra = sorted(said - received), sorted(received - said)
            problems.append(f"subscriber: {len(said)} lines said, {len(received)} received; "
                            f"{len(missing)} missed (first {missing[:1]}), {len(extra)} not in the audit "
                            f"(first {extra[:1]})")
        if self.s.model_faults:
            silent = [r.id for r in records if not r.line]
            if silent:
                problems.append(f"{len(silent)} inference(s) without a line, first {silent[0]}")
            for r in records:
                result = replay(r)
                if not result.ok:
                    problems.append(f"record {r.id} does not replay: {result.difference}")
                    break
        elif all(f.kind in INFRA for f in self.s.faults):
            changes = {w.key: w.value for w in self.s.world_changes}
            taken = world_ticks(dbs, changes)
            world = [(tick, key, changes[key]) for key, tick in taken.items()]
            calm_db = self.workdir / "calm.db"
            expected = await calm_run(self.scenario, self.run_id, self.s.ticks, calm_db, stored, world)
            if expected != got:
                problems.append(first_difference(expected, got, records))


def first_difference(expected: AuditSet, got: AuditSet, records: list[AuditRecord]) -> str:
    """How the audit differs from the calm run's, and its earliest record that differs, said plainly."""
    calm = {r[0]: r for r in expected}
    here = {r[0]: r for r in got}
    ids = sorted({*calm, *here} - {i for i in calm if calm[i] == here.get(i)},
                 key=lambda i: (int(i.rsplit(":", 2)[1]), i))
    first = ids[0]
    head = f"audit differs from the calm run in {len(ids)} of {len(calm)} records; the first, {first}: "
    if first not in here:
        return head + "not in the faulted run"
    if first not in calm:
        return head + "not in the calm run"
    record = next(r for r in records if r.id == first)
    why = f" (a fallback: {record.fallback_reason})" if record.fallback else ""
    if here[first][2] != calm[first][2]:
        return head + f"said {here[first][2]!r}{why}, the calm run {calm[first][2]!r}"
    return head + f"the same line from another prompt (digests {here[first][1]} here, {calm[first][1]} calm)"


@contextlib.asynccontextmanager
async def _running(schedule: Schedule, workdir: Path) -> AsyncIterator[Run]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    broker = MosquittoProcess(binary, workdir)
    async with contextlib.AsyncExitStack() as stack:
        run = Run(schedule, workdir, broker, f"faults{schedule.seed}")
        if schedule.netns:
            run.ns = stack.enter_context(netns(schedule.seed))
            with broker.config_path.open("a") as conf:
                conf.write(f"\nlistener {broker.port} {run.ns.host_addr}\n")
        broker.start()
        stack.callback(broker.stop)
        if schedule.model_faults:
            run.model = await stack.enter_async_context(open_fake_openai())
        if schedule.proxied:
            run.proxy = await stack.enter_async_context(fault_proxy(broker.port))
            run.proxy.delay_s = SLOW_LINK_S
        listening = asyncio.create_task(run.subscriber.serve())

        async def unsubscribe() -> None:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)

        stack.push_async_callback(unsubscribe)
        stack.push_async_callback(run.stop_all)
        await eventually(lambda: run.subscriber.connected.is_set() or listening.done(),
                         what="the subscriber connecting", within=LIVE_S)
        if listening.done():
            listening.result()  # raises what ended it
        yield run


async def run_schedule(schedule: Schedule, workdir: Path) -> Outcome:
    """Execute `schedule` in `workdir` and check the run; problems go into the outcome, never raised."""
    async with _running(schedule, workdir) as run:
        try:
            for _ in range(schedule.workers):
                await run.start_worker()
            for shard in run.shards:
                await run.start_shard(shard, resume=False)
            await run.drive()
            await run.finish()
            said = run.lines_said()
            with contextlib.suppress(AssertionError):  # the check below says what did not come
                await eventually(lambda: said <= run.subscriber.said.keys(), what="the last lines", within=10)
        except (AssertionError, TimeoutError) as exc:
            run.outcome.problems.append(f"the run did not finish: {exc or type(exc).__name__} at ticks {run.ticks()}")
            return run.outcome
    if not run.outcome.problems or all(p.startswith("subscriber") for p in run.outcome.problems):
        await run.check()
    return run.outcome
