"""Outside input begins the next tick before the pace, and its addressee answers in that tick.

The village on the in-memory broker and one virtual clock, at a pace of a virtual second a
tick: a player's questions, published right after a tick ended (the pace then waits almost
a whole second), are answered within a tenth of a virtual second, in the tick that took
them; on three shards the one holding the innkeeper (shard 2) says so on the barrier
(`Start`) and every shard begins that tick too. The run is the same run: one shard given
the same inputs at the same ticks (its arrivals journal filled before it starts, so its
ticks begin early too) says the same, record by record. A re-execution of a run with early
ticks is identical (tests/test_replay.py); a quiet world keeps its pace (tests/test_shard.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sim.protocol.outside import InputArrival
from sim.scenario import load_scenario
from sim.shard import InferenceConfig, RunConfig, RunStats, Shard, VirtualClock
from sim.shard._turns import TurnQueue
from sim.store import open_reader, open_store
from sim.wire import topics
from sim.wire.barrier import Start, decode_barrier
from sim.wire.events import decode_say
from sim.wire.inputs import OutsideInput, Presence, Taken
from tests.helpers import VILLAGE, eventually
from tests.memory_broker import MemoryBroker
from tests.memory_shard import memory_shard, run_shards

TICK_MS = 1000
TICKS = 16
QUESTIONS = {3: "q1", 6: "q2", 10: "q3"}  # after which tick ended, the question's id
RUN = "early"


class TimedBroker(MemoryBroker):
    """The in-memory broker, with the virtual time of every message published."""

    def __init__(self, seed: int, clock: VirtualClock) -> None:
        super().__init__(seed, clock)
        self.times: list[tuple[float, str, bytes]] = []

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.times.append((self.clock.now(), topic, payload))
        super().publish(topic, payload, retain=retain)


Asks = Callable[[TimedBroker, list[RunStats]], Awaitable[None]]


async def village(tmp_path: Path, name: str, shards: int, *, during: Asks | None = None,
                  journal: list[InputArrival] | None = None) -> tuple[TimedBroker, list[RunStats], list[Path]]:
    """The village on `shards` shards to TICKS; `during` acts on the live run, `journal` is
    in the arrivals journal of the shard holding the innkeeper (shard 0 of 1) before it starts."""
    clock = VirtualClock(autojump=0.005)
    broker = TimedBroker(7, clock)
    loaded = load_scenario(VILLAGE)
    stats = [RunStats(shard=str(i)) for i in range(shards)]
    dbs = [tmp_path / f"{name}-{i}.db" for i in range(shards)]
    if journal:
        async with open_store(dbs[-1]) as store:
            for arrival in journal:
                store.arrivals.add(arrival)

    configs = [RunConfig(scenario=VILLAGE, run_id=RUN, ticks=TICKS, shard=f"{i}/{shards}", tick_ms=TICK_MS)
               for i in range(shards)]
    await run_shards(broker, loaded, configs, dbs, stats, during(broker, stats) if during else None)
    assert all(s.tick == TICKS - 1 for s in stats)
    return broker, stats, dbs


async def ask(broker: TimedBroker, stats: list[RunStats]) -> None:
    """Each question right after its tick ended on every shard: the pace then has almost a
    whole second to wait."""
    for after, question in QUESTIONS.items():
        await eventually(lambda after=after: min(s.ticks_done for s in stats) > after,  # type: ignore[misc]
                         what=f"tick {after} done", every=0.001)
        broker.publish(topics.player_input(RUN, "visitor"),
                       json.dumps({"to": "innkeeper", "text": f"Question {question}?", "id": question}).encode())


def answers(broker: TimedBroker) -> dict[str, tuple[float, int]]:
    """Each question's virtual latency (publish to the innkeeper's `say` with its id) and the
    tick of that say; a question answered twice fails."""
    asked = {json.loads(p)["id"]: t for t, topic, p in broker.times if topic.endswith("/visitor/input")}
    said: dict[str, tuple[float, int]] = {}
    for t, topic, payload in broker.times:
        if topic.endswith("/say"):
            say = decode_say(payload)
            if say.reply_to is not None:
                assert say.reply_to not in said, f"{say.reply_to} answered twice"
                said[say.reply_to] = (t - asked[say.reply_to], say.tick)
    return said


def inputs_of(dbs: list[Path]) -> list[tuple[int, Taken]]:
    taken: list[tuple[int, Taken]] = []
    for db in dbs:
        with open_reader(db) as reader:
            taken += reader.all_inputs()
    return sorted(taken, key=lambda x: x[0])


def audit_of(dbs: list[Path]) -> set[tuple[str, int, str, str]]:
    records = set()
    for db in dbs:
        with open_reader(db) as reader:
            records |= {(r.id, r.tick, r.prompt_sha256, r.line) for r in reader.audit_records()}
    return records


async def test_a_question_is_answered_in_the_tick_that_takes_it_without_waiting_for_the_pace(tmp_path: Path) -> None:
    broker, stats, dbs = await village(tmp_path, "one", 1, during=ask)
    said = answers(broker)
    taken = {t.id: tick for tick, t in inputs_of(dbs) if isinstance(t, OutsideInput)}
    assert sorted(said) == sorted(taken) == sorted(QUESTIONS.values())
    for question, (latency, tick) in said.items():
        assert tick == taken[question], f"{question} taken at tick {taken[question]}, answered at {tick}"
        assert latency <= 0.15, f"{question}: {latency:.3f} virtual seconds"  # 0.1 s at most after its tick began
    assert stats[0].early_ticks == len(QUESTIONS)


async def test_a_player_at_the_place_is_answered_at_once_and_once(tmp_path: Path) -> None:
    """At the inn (the game system's presence), the visitor's input is said there, where the
    place's log takes it: answered in the tick that took it, and never as mail again."""

    async def at_the_inn(broker: TimedBroker, stats: list[RunStats]) -> None:
        await eventually(lambda: stats[0].ticks_done > 2, what="tick 2 done", every=0.001)
        broker.publish(topics.player_presence(RUN, "visitor"), b'{"location": "inn"}')
        await eventually(lambda: stats[0].ticks_done > 6, what="tick 6 done", every=0.001)
        broker.publish(topics.player_input(RUN, "visitor"),
                       b'{"to": "innkeeper", "text": "Is the ale any good?", "id": "here"}')

    broker, _, dbs = await village(tmp_path, "inn", 1, during=at_the_inn)
    taken = inputs_of(dbs)
    [present] = [tick for tick, t in taken if isinstance(t, Presence)]
    [asked] = [tick for tick, t in taken if isinstance(t, OutsideInput)]
    assert present < asked
    said = answers(broker)  # once: a second answer fails there
    assert said["here"][1] == asked and said["here"][0] <= 0.15
    with open_reader(dbs[0]) as reader:
        heard = [r.tick for r in reader.audit_records("innkeeper") if r.player_input.startswith("visitor: ")]
    assert heard == [asked]


async def test_three_shards_begin_together_and_say_what_one_shard_given_the_same_inputs_says(
    tmp_path: Path
) -> None:
    broker, stats, dbs = await village(tmp_path, "three", 3, during=ask)
    said = answers(broker)
    taken = inputs_of(dbs)
    ticks = {t.id: tick for tick, t in taken if isinstance(t, OutsideInput)}
    assert sorted(said) == sorted(ticks) == sorted(QUESTIONS.values())
    assert all(said[q][1] == ticks[q] and said[q][0] <= 0.15 for q in said), (said, ticks)
    starts = [decode_barrier(p) for _, topic, p in broker.times if "/barrier/" in topic]
    # shard 2 holds the inn: it said so, and every shard began those ticks before the pace
    started = sorted((m.shard, m.tick) for m in starts if isinstance(m, Start))
    assert started == [("2", t) for t in sorted(ticks.values())]
    assert [s.early_ticks for s in stats] == [len(QUESTIONS)] * 3

    journal = [InputArrival(tick=tick, input=t) for tick, t in taken]
    _, alone, one = await village(tmp_path, "alone", 1, journal=journal)
    assert inputs_of(one) == taken
    assert alone[0].early_ticks == len(QUESTIONS)
    expected, got = audit_of(dbs), audit_of(one)
    assert expected == got, (sorted(expected - got)[:3], sorted(got - expected)[:3])


async def test_a_question_during_a_ticks_turns_joins_them_and_one_shard_given_it_says_the_same(
    tmp_path: Path
) -> None:
    """Asked while a tick's turns are under way (each scripted answer takes 50 ms), of an NPC
    that takes none of them: the tick takes the question and its NPC answers in that tick, in
    a turn of its own; one shard given the same inputs at the same ticks says the same."""
    clock = VirtualClock(autojump=0.005)
    broker = TimedBroker(7, clock)
    slow = InferenceConfig(backend="scripted", backend_options={"delay_ms": 50})
    config = RunConfig(scenario=VILLAGE, run_id=RUN, ticks=TICKS, tick_ms=TICK_MS, inference=slow)
    stats = RunStats(shard="0")
    asked: dict[str, int] = {}

    async def during(shard: Shard) -> None:
        for question in ("j1", "j2"):
            await eventually(lambda: shard.turns.joinable("innkeeper") is not None  # type: ignore[misc]
                             and shard.next_tick not in asked.values(), what="turns under way", every=0.001)
            asked[question] = shard.next_tick
            broker.publish(topics.player_input(RUN, "visitor"),
                           json.dumps({"to": "innkeeper", "text": f"Question {question}?", "id": question}).encode())
            await eventually(lambda q=question: shard.next_tick > asked[q], what="the tick done",  # type: ignore[misc]
                             every=0.001)

    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        async with memory_shard(broker, load_scenario(VILLAGE), config, tmp_path / "join.db", stats,
                                asyncio.Event()) as shard:
            await shard.start()
            async with asyncio.timeout(120):
                await asyncio.gather(shard.run(until=shard.end), during(shard))
        server.cancel()
    said = answers(broker)
    taken = {t.id: tick for tick, t in inputs_of([tmp_path / "join.db"]) if isinstance(t, OutsideInput)}
    assert taken == asked  # journaled with the tick under way
    assert {q: said[q][1] for q in asked} == asked  # and answered in it
    assert stats.joined_turns == 2 and stats.early_ticks == 0

    journal = [InputArrival(tick=tick, input=t) for tick, t in inputs_of([tmp_path / "join.db"])]
    _, _, one = await village(tmp_path, "alone", 1, journal=journal)
    expected, got = audit_of([tmp_path / "join.db"]), audit_of(one)
    assert expected == got, (sorted(expected - got)[:3], sorted(got - expected)[:3])


def test_a_turn_waiting_for_a_worker_takes_a_joined_input_first_and_a_started_one_refuses_it() -> None:
    queue: TurnQueue[tuple[str, bool, tuple[str, ...]]] = TurnQueue({"a": ("a", False, ()), "b": ("b", True, ())})
    queue.working = 1
    assert queue.next() == ("a", False, ())
    assert queue.started("a") and not queue.started("b")
    with pytest.raises(ValueError, match="taken already"):
        queue.put("a", lambda turn: ("a", False, ("input",)))
    queue.put("b", lambda turn: ("b", turn[1] if turn else False, ("input",)))
    queue.put("c", lambda turn: ("c", turn[1] if turn else False, ("input",)))
    assert [queue.next(), queue.next()] == [("b", True, ("input",)), ("c", False, ("input",))]
    assert queue.next() is None and not queue.open  # the last worker closed it: nothing joins now
