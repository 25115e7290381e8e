"""One fuzz schedule: hostile payloads sent to every topic a live village run reads, then the checks.

A fresh Mosquitto from broker-config/ per run (nothing retained from another), the village
run in this process (`sim.shard.run`) paced at `TICK_MS`, a live view following it
(`sim.view.LiveView`, served on a free port), and, on odd seeds, its inferences served by a
remote worker in this process (`inference.placement = "remote"`). One client publishes the
seed's payloads, each to a topic of a kind drawn from every kind one of them reads: players' input
(under good and hostile player ids), the game system's topics, world state, presence, a
place's events, an NPC's inbox and the shard's barrier (the run); `infer/req` (the worker);
`infer/resp/0` and `infer/worker/+` (the run's pool); say, player errors, status, trace and
roster (the view, which reads player input and world state too). Meanwhile a hostile page
POSTs every payload to the view's /api/say and asks its GET endpoints hostile queries. The checks:
- the run ends at its last tick, however it was fed, and the worker serves to the end;
- every payload is accounted for by each of its readers' own counters, one each: the run's
  refused or malformed (`bus.refused`, `bus.malformed`), the worker's malformed, the pool's
  malformed or late replies (a forged reply), the view's malformed (`health.malformed`);
- the view never answers 5xx, takes no hostile body as a player's input, and its /api/state
  answers afterwards with the same count;
- the audit (ids, ticks, prompts, lines) equals the clean run's, in this process without any
  payload: nothing refused reached a memory, a prompt or a line, and where inferences were
  served does not change it; and no outside input was journaled.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import httpx

from sim.inference import RemoteWorker, WorkerConfig
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader, read_arrivals
from sim.view import TOKEN_HEADER, LiveView, build_app, open_view_server
from sim.wire import topics
from tests.fuzz.payloads import NOBODY, Payload, draw_payloads, draw_query
from tests.helpers import VILLAGE, MosquittoProcess, eventually, require_mosquitto
from tests.view_client import page_meta

__all__ = ["Outcome", "Target", "clean_audit", "fuzz_run", "targets"]

RUN = "fuzz"
TICKS = 120
TICK_MS = 25
WORKER = "fuzz-worker"
PLAYERS = ("visitor", "p.1", "<|im_start|>", "a" * 300, "game", "shard", "\u202eevil", "")

Counts = collections.Counter[str]  # by reader: "run", "worker", "pool", "view"


@dataclass(frozen=True)
class Target:
    kind: str  # what the topic is, as the summary names it
    topic: str
    readers: frozenset[str]


def _target(kind: str, topic: str, *readers: str) -> Target:
    return Target(kind, topic, frozenset(readers))


def targets(remote: bool = True) -> list[Target]:
    """Every topic the run, its remote worker (`remote`) and a view following it read, with who reads it."""
    found = [_target("player input", topics.player_input(RUN, p) if p else f"npcsim/{RUN}/player//input", "run", "view")
             for p in PLAYERS]
    found += [_target("presence", f"npcsim/{RUN}/player/{p}/presence", "run") for p in PLAYERS[:3]]
    found += [_target("game event", topics.game_event(RUN), "run"), _target("game fact", topics.game_fact(RUN), "run"),
              _target("world state", topics.world_state(RUN), "run", "view"),
              _target("place events", topics.location_events(RUN, "inn"), "run"),
              _target("inbox", topics.agent_inbox(RUN, "innkeeper"), "run"),
              _target("barrier", topics.barrier(RUN, "0"), "run")]
    found += [_target("say", topics.agent_say(RUN, a), "view") for a in ("innkeeper", NOBODY)]
    found += [_target("player error", topics.player_error(RUN, p), "view") for p in PLAYERS[:3]]
    found += [_target("status", topics.status(RUN, s), "view") for s in ("0", "9")]
    found += [_target("trace", topics.trace(RUN, "0"), "view"), _target("roster", topics.roster(RUN, "0"), "view")]
    if remote:
        found += [_target("inference request", topics.infer_request(RUN), "worker"),
                  _target("inference reply", topics.infer_response(RUN, "0"), "pool")]
        found += [_target("worker status", topics.infer_worker(RUN, w), "pool") for w in (WORKER, "another", "<|x|>")]
    return found


@dataclass
class Outcome:
    remote: bool = False
    sent: collections.Counter[str] = field(default_factory=collections.Counter)  # by payload kind
    topics: collections.Counter[str] = field(default_factory=collections.Counter)  # by topic kind
    requests: collections.Counter[str] = field(default_factory=collections.Counter)  # to the view, by endpoint
    expected: Counts = field(default_factory=collections.Counter)  # payloads each reader was sent
    counted: Counts = field(default_factory=collections.Counter)  # what each reader's counters say it refused
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _config(broker: MosquittoProcess, db: Path, *, remote: bool = False) -> RunConfig:
    return RunConfig(scenario=str(VILLAGE), run_id=RUN, until_tick=TICKS, tick_ms=TICK_MS,
                     broker=BrokerConfig(url=broker.url), record=RecordConfig(db=str(db)),
                     inference=InferenceConfig(placement="remote") if remote else InferenceConfig())


def _counts(stats: RunStats, worker: RemoteWorker | None, view: LiveView) -> Counts:
    """What each reader counted as refused, malformed or (a pool's) late, so far."""
    counts: Counts = collections.Counter(view=view.model.health.malformed)
    if stats.bus is not None:
        counts["run"] = sum(stats.bus.malformed.values()) + sum(stats.bus.refused.values())
    if worker is not None:
        counts["worker"] = worker.statistics().malformed
    if stats.pool is not None:
        pool = stats.pool()
        counts["pool"] = pool.malformed + pool.late_replies
    return counts


def audit_digest(db: Path) -> tuple[int, str]:
    """How many records, and a digest of their ids, ticks, prompts and lines in id order."""
    with open_reader(db) as reader:
        rows = sorted((r.id, r.tick, r.prompt_sha256, r.line) for r in reader.audit_records())
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


async def clean_audit(directory: Path) -> tuple[int, str]:
    """The village's audit without a single hostile payload."""
    broker = MosquittoProcess(require_mosquitto(), directory)
    broker.start()
    try:
        await run(_config(broker, directory / "clean.db"))
    finally:
        broker.stop()
    return audit_digest(directory / "clean.db")


async def fuzz_run(seed: int, count: int, directory: Path, clean: tuple[int, str]) -> Outcome:
    rng = random.Random(seed)
    payloads = draw_payloads(rng, count)
    outcome = Outcome(remote=seed % 2 == 1)
    where = targets(outcome.remote)
    db = directory / f"fuzz-{seed}.db"
    broker = MosquittoProcess(require_mosquitto(), directory)
    broker.start()
    stats = RunStats()
    view = LiveView(RUN)
    worker = RemoteWorker(WorkerConfig(broker=broker.address, run_id=RUN, name=WORKER)) if outcome.remote else None
    try:
        async with (aiomqtt.Client("127.0.0.1", broker.port, max_queued_outgoing_messages=None) as client,
                    open_view_server(build_app(view.source()), "127.0.0.1", 0) as url,
                    httpx.AsyncClient(base_url=url, timeout=60) as page, asyncio.TaskGroup() as group):
            following = group.create_task(view.follow(broker.address, RUN))
            serving = None if worker is None else group.create_task(worker.run())
            if worker is not None:
                await eventually(worker.ready.is_set, what="the worker serving", within=60)
            job = group.create_task(run(_config(broker, db, remote=outcome.remote), stats=stats))
            await eventually(lambda: stats.tick >= 1 and view.model.npcs, what="the run under way, the view on it",
                             within=60)
            before = _counts(stats, worker, view)
            asking = group.create_task(_ask_the_view(page, random.Random(f"view {seed}"), payloads, outcome))
            for payload in payloads:
                await _send(client, rng, where, payload, outcome)
            await eventually(lambda: _counts(stats, worker, view) - before >= outcome.expected,
                             what="every payload counted by each of its readers", within=60)
            ended = await job
            await asking
            if serving is not None and serving.done():
                outcome.problems.append("the worker stopped serving")
            outcome.counted = _counts(stats, worker, view) - before
            await _check_the_view_serves(page, view, outcome)
            following.cancel()
            if serving is not None:
                serving.cancel()
    finally:
        broker.stop()
    _check(outcome, ended, db, clean)
    return outcome


async def _send(client: aiomqtt.Client, rng: random.Random, where: list[Target], payload: Payload,
                outcome: Outcome) -> None:
    kind = rng.choice(sorted({t.kind for t in where}))  # each kind alike: the single inference topics get their share
    target = rng.choice([t for t in where if t.kind == kind])
    await client.publish(target.topic, payload.body, qos=1)
    outcome.sent[payload.kind] += 1
    outcome.topics[target.kind] += 1
    outcome.expected.update(target.readers)


async def _ask_the_view(page: httpx.AsyncClient, rng: random.Random, payloads: list[Payload], outcome: Outcome) -> None:
    """What a hostile page does: every payload POSTed to /api/say as the view's own page would
    (its Origin and token), and as many hostile GETs. None may be a 5xx, no body a player's input."""
    token = page_meta((await page.get("/")).text)["token"]
    headers = {"Content-Type": "application/json", "Origin": str(page.base_url).rstrip("/"), TOKEN_HEADER: token}
    for payload in payloads:
        said = await page.post("/api/say", content=payload.body, headers=headers)
        outcome.requests["POST /api/say"] += 1
        if not 400 <= said.status_code < 500:
            outcome.problems.append(f"POST /api/say answered {said.status_code} to a {payload.kind} body")
        endpoint, path = draw_query(rng)
        async with page.stream("GET", path) as asked:  # /api/events streams: its status is enough
            outcome.requests[f"GET {endpoint}"] += 1
            if asked.status_code >= 500:
                outcome.problems.append(f"GET {path[:120]} answered {asked.status_code}")


async def _check_the_view_serves(page: httpx.AsyncClient, view: LiveView, outcome: Outcome) -> None:
    state = await page.get("/api/state")
    if state.status_code != 200:
        outcome.problems.append(f"the view's /api/state answered {state.status_code} after the payloads")
    elif state.json()["health"]["malformed"] != view.model.health.malformed:
        outcome.problems.append(f"the view's /api/state says {state.json()['health']['malformed']} malformed, "
                                f"its model {view.model.health.malformed}")


def _check(outcome: Outcome, ended: RunStats, db: Path, clean: tuple[int, str]) -> None:
    if ended.tick != TICKS - 1:
        outcome.problems.append(f"the run ended at tick {ended.tick}, not {TICKS - 1}")
    if outcome.counted != outcome.expected:
        readers = sorted(outcome.expected | outcome.counted)
        outcome.problems.append("payloads sent to each reader against what it counted: " + ", ".join(
            f"{r} {outcome.expected[r]}/{outcome.counted[r]}" for r in readers))
    if read_arrivals(db, None):
        outcome.problems.append("an outside input was journaled")
    digest = audit_digest(db)
    if digest != clean:
        outcome.problems.append(f"the audit differs from the clean run's: {digest} against {clean}")
