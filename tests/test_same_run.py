"""The run is a function of scenario, seed and inputs, however it is deployed and whatever fails.

On a real Mosquitto, with the scripted backend, for the village, a generated world of 200
NPCs and the town of a day whose NPCs walk between places that different shards hold (and,
for one shard, three, and kill -9 with --resume, a busy world whose NPCs recall from their
whole history: sim.memory recall, a place's summaries), the set of audit
records (id, SHA-256 of the prompt, line) is the same for:
one shard; three shards; two shards serving their inferences in worker processes; two
shards with one started seconds after the other; a broker
stopped for longer than the echo timeout and started again; a kill -9 of one shard at a
random tick and --resume to the same horizon; and, with a player's questions that begin
their ticks before the pace (answered in them), three shards and one shard given the same
inputs at the same ticks. The comparison is record by record, so a
single line said differently fails it, and the failure names the records that differ.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiomqtt
import pytest

from sim.protocol.outside import InputArrival
from sim.shard import BrokerConfig, InferenceConfig, Limits, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader, open_store
from sim.wire import topics
from sim.wire.events import decode_status
from sim.wire.inputs import OutsideInput
from tests.helpers import (
    TOWN,
    VILLAGE,
    MosquittoProcess,
    committed_tick,
    elapse,
    eventually,
    generated_world,
    recall_world,
    start_npcsim,
)

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(600)]

RUN = "same"
HORIZON = {"village": 60, "generated": 16, "recall": 70, "town": 48}
AuditSet = set[tuple[str, str, str]]
_REFERENCE: dict[str, AuditSet] = {}
_STATES: dict[str, dict[str, object]] = {}


def scenario_path(world: str, tmp_path: Path) -> str:
    if world == "village":
        return VILLAGE
    if world == "recall":
        return recall_world(tmp_path)
    if world == "town":
        return TOWN
    return generated_world(tmp_path)


def audit_set(dbs: list[Path]) -> AuditSet:
    records: AuditSet = set()
    for db in dbs:
        with open_reader(db) as reader:
            records |= {(r.id, r.prompt_sha256, r.line) for r in reader.audit_records()}
    return records


def npc_states(dbs: list[Path]) -> dict[str, object]:
    """Every NPC's state as its shard's store holds it at the end (places' logs left out: a
    shard keeps the log of each place it heard, and which those are depends on the layout)."""
    states: dict[str, object] = {}
    for db in dbs:
        with open_reader(db) as reader:
            states |= {who: state for who, state in reader.final_state().items() if not who.startswith("place:")}
    return states


def config(world: str, tmp_path: Path, broker: str, shard: str, **kw: object) -> RunConfig:
    index = shard.split("/")[0]
    return RunConfig(
        scenario=scenario_path(world, tmp_path),
        broker=BrokerConfig(url=broker),
        run_id=RUN,
        until_tick=HORIZON[world],
        shard=shard,
        record=RecordConfig(db=str(tmp_path / f"{world}-{shard.replace('/', 'of')}-{index}.db")),
        **kw,  # type: ignore[arg-type]
    )


async def run_shards(
    world: str,
    tmp_path: Path,
    broker: str,
    count: int,
    *,
    during: Callable[[list[RunStats]], Awaitable[None]] | None = None,
    **kw: object,
) -> tuple[list[Path], list[RunStats]]:
    """Run `count` shards in this process, concurrently; `during` acts on the live run."""
    configs = [config(world, tmp_path, broker, f"{i}/{count}", **kw) for i in range(count)]
    stats = [RunStats() for _ in configs]
    async with asyncio.TaskGroup() as group:
        jobs = [group.create_task(run(c, stats=s)) for c, s in zip(configs, stats, strict=True)]
        if during is not None:
            await during(stats)
        await asyncio.gather(*jobs)
    for s in stats:
        assert s.tick == HORIZON[world] - 1, f"shard {s.shard} stopped at tick {s.tick}"
    return [Path(c.record.db) for c in configs if c.record.db], stats


async def reference(world: str, tmp_path: Path, mosquitto: MosquittoProcess) -> AuditSet:
    """One shard, calm weather: the run every other deployment must reproduce."""
    if world not in _REFERENCE:
        where = tmp_path / "reference"
        where.mkdir()
        dbs, _ = await run_shards(world, where, mosquitto.url, 1)
        _REFERENCE[world] = audit_set(dbs)
        _STATES[world] = npc_states(dbs)
        assert len(_REFERENCE[world]) > 20, "too few inferences for the comparison to mean anything"
        if world == "recall":
            with open_reader(dbs[0]) as reader:
                recalled = {i for r in reader.audit_records() for i in r.recalled}
            assert any(i.startswith("sum:") for i in recalled), "no summary recalled: the world does not test folding"
            assert any(i.startswith("ev:") for i in recalled), "no kept memory recalled"
    return _REFERENCE[world]


def assert_same(world: str, expected: AuditSet, got: AuditSet, case: str) -> None:
    missing, extra = sorted(expected - got), sorted(got - expected)
    assert not missing and not extra, f"{world}, {case}: {len(missing)} records missing {missing[:3]}, " \
        f"{len(extra)} different {extra[:3]}"
    print(f"\n{world}, {case}: {len(got)} audit records compared, identical")


LIVE_S = 120.0  # how long a condition on a live run may take (generous: the machine is shared)


WORLDS = pytest.mark.parametrize("world", ["village", "generated", "town"])
RECALLING = pytest.mark.parametrize("world", ["village", "generated", "recall", "town"])
"""The cases a world that recalls from its whole history (retrieval, summaries) runs too; and
every case the town, whose NPCs walk between places that different shards hold."""
MOVING = (7, 17, 19, 23)
"""Town ticks after which many NPCs walk (hours 8, 18, 20; 23, after most came home): a kill
then is a kill during moves."""


@RECALLING
async def test_one_shard_twice(world: str, mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    expected = await reference(world, tmp_path, mosquitto)
    again, _ = await run_shards(world, tmp_path, mosquitto.url, 1)
    assert_same(world, expected, audit_set(again), "1 shard")


@RECALLING
async def test_three_shards(world: str, mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    expected = await reference(world, tmp_path, mosquitto)
    dbs, _ = await run_shards(world, tmp_path, mosquitto.url, 3)
    assert_same(world, expected, audit_set(dbs), "3 shards")
    assert npc_states(dbs) == _STATES[world], "an NPC's state at the end differs on 3 shards"


@WORLDS
async def test_two_shards_serving_in_worker_processes(world: str, mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    expected = await reference(world, tmp_path, mosquitto)
    dbs, _ = await run_shards(world, tmp_path, mosquitto.url, 2, inference=InferenceConfig(placement="process"))
    assert_same(world, expected, audit_set(dbs), "2 shards, each serving in a worker process")


@WORLDS
async def test_a_shard_started_seconds_later(world: str, mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    expected = await reference(world, tmp_path, mosquitto)
    stats = [RunStats(), RunStats()]
    configs = [config(world, tmp_path, mosquitto.url, f"{i}/2") for i in range(2)]
    async with asyncio.TaskGroup() as group:
        first = group.create_task(run(configs[0], stats=stats[0]))
        await eventually(lambda: stats[0].awaiting == "shard 1", what="shard 0 saying it awaits shard 1",
                         within=LIVE_S)
        await elapse(1.5)  # the subject: shard 1 starts seconds after shard 0, which must hold meanwhile
        assert stats[0].tick == 0, "shard 0 ran ahead without shard 1"
        second = group.create_task(run(configs[1], stats=stats[1]))
        await asyncio.gather(first, second)
    dbs = [Path(c.record.db) for c in configs if c.record.db]
    assert_same(world, expected, audit_set(dbs), "2 shards, one 2 s late")


@WORLDS
async def test_broker_down_longer_than_the_echo_timeout(
    world: str, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    expected = await reference(world, tmp_path, mosquitto)

    async def outage(stats: list[RunStats]) -> None:
        await eventually(lambda: min(s.tick for s in stats) >= 4, what="the run getting going", within=LIVE_S)
        await asyncio.to_thread(mosquitto.stop)
        await elapse(2.5)  # the subject: the broker stays down longer than the echo timeout (1 s)
        await asyncio.to_thread(mosquitto.start)

    dbs, stats = await run_shards(world, tmp_path, mosquitto.url, 2, during=outage, tick_ms=60,
                                  limits=Limits(echo_timeout=1.0))
    assert all(s.bus.reconnects >= 1 and s.stalls >= 1 for s in stats), "the outage did not hit the run"
    assert_same(world, expected, audit_set(dbs), "2 shards, broker down 2.5 s (echo timeout 1 s)")


@RECALLING
async def test_kill_9_and_resume(world: str, mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    expected = await reference(world, tmp_path, mosquitto)
    horizon = HORIZON[world]
    rng = random.Random(os.urandom(8))
    kill_at = rng.choice(MOVING) if world == "town" else rng.randrange(2, horizon - 6)
    dbs = [tmp_path / f"kill-{i}.db" for i in range(2)]
    logs = [tmp_path / f"kill-{i}.log" for i in range(3)]

    async def start(i: int, log: Path, *extra: str) -> asyncio.subprocess.Process:
        with log.open("wb") as err:
            return await start_npcsim(
                "run", scenario_path(world, tmp_path), "--broker", mosquitto.url, "--run-id", RUN,
                "--shard", f"{i}/2", "--until-tick", str(horizon), "--tick-ms", "200", "--db", str(dbs[i]),
                "--quiet", *extra, stdout=asyncio.subprocess.DEVNULL, stderr=err,
            )

    procs = [await start(i, logs[i]) for i in range(2)]
    try:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(topics.status(RUN, "0"), qos=1)
            await eventually(lambda: committed_tick(dbs[1]) >= kill_at, what=f"shard 1 committing tick {kill_at}",
                             within=LIVE_S)
            assert procs[1].returncode is None, "shard 1 ended before the kill (a slow machine: raise --tick-ms)"
            procs[1].kill()
            await procs[1].wait()
            killed_after = committed_tick(dbs[1])
            async with asyncio.timeout(60):  # the others hold, and say for whom
                async for message in client.messages:
                    status = decode_status(bytes(message.payload))  # type: ignore[arg-type]
                    if status.awaiting and "shard 1" in status.awaiting:
                        break
            assert committed_tick(dbs[0]) <= killed_after + 1
            procs[1] = await start(1, logs[2], "--resume")
            for i, proc in enumerate(procs):
                async with asyncio.timeout(120):
                    code = await proc.wait()
                assert code == 0, f"shard {i}: {logs[i if i == 0 else 2].read_text()[-2000:]}"
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert committed_tick(dbs[0]) == committed_tick(dbs[1]) == horizon - 1
    assert_same(world, expected, audit_set(dbs), f"kill -9 of shard 1 after tick {killed_after}, --resume")
    assert npc_states(dbs) == _STATES[world], "an NPC's state at the end differs after kill -9 and --resume"
    for db in dbs:  # the chain over the audit and the inputs holds across the kill and the resume
        with open_reader(db) as reader:
            assert reader.verify(None).last_tick == horizon - 1


QUESTIONS = (4, 9, 15)
"""After which ticks a visitor asks the innkeeper something (shard 2 of 3 holds the inn)."""


async def test_questions_that_begin_ticks_early_on_three_shards_and_on_one(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    async def ask(stats: list[RunStats]) -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            for n, after in enumerate(QUESTIONS):
                await eventually(lambda after=after: min(s.ticks_done for s in stats) > after,  # type: ignore[misc]
                                 what=f"tick {after} done", within=LIVE_S, every=0.002)
                question = {"to": "innkeeper", "text": f"Question {n}?", "id": f"q{n}"}
                await client.publish(topics.player_input(RUN, "visitor"), json.dumps(question), qos=1)

    dbs, stats = await run_shards("village", tmp_path, mosquitto.url, 3, during=ask, tick_ms=150)
    taken, answered = [], []
    for db in dbs:
        with open_reader(db) as reader:
            taken += reader.all_inputs()
            answered += [r.tick for r in reader.audit_records() if r.player_input.startswith("visitor: ")]
    taken.sort(key=lambda x: x[0])
    asked = [tick for tick, i in taken if isinstance(i, OutsideInput)]
    assert len(asked) == len(QUESTIONS)
    answered.sort()
    assert answered == asked, "a question not answered in the tick that took it"
    assert all(s.early_ticks >= 1 for s in stats), [s.early_ticks for s in stats]

    alone = tmp_path / "alone"
    alone.mkdir()
    async with open_store(alone / "village-0of1-0.db") as store:  # the same inputs, at the same ticks
        for tick, taken_input in taken:
            store.arrivals.add(InputArrival(tick=tick, input=taken_input))
    one, [stat] = await run_shards("village", alone, mosquitto.url, 1, tick_ms=150)
    assert stat.early_ticks == len(QUESTIONS)
    assert_same("village", audit_set(dbs), audit_set(one), f"3 shards and 1, questions at ticks {asked}")
