"""The arrivals journal (sim.store._arrivals): kept until its tick commits, read back whole or not at all,
and taken again at its tick by a resumed shard."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import msgspec
import pytest

from sim.protocol.outside import InputArrival, OutsideInput, WorldArrival
from sim.scenario import load_scenario
from sim.shard import RecordConfig, RunConfig, RunStats, VirtualClock
from sim.store import arrivals_path, open_reader, open_store, read_arrivals
from sim.wire import topics
from tests.helpers import VILLAGE, eventually
from tests.memory_broker import MemoryBroker
from tests.memory_shard import memory_shard


async def test_arrivals_stay_until_their_tick_commits_and_a_reopened_store_has_them(tmp_path: Path) -> None:
    db = tmp_path / "tw.db"
    first = InputArrival(tick=0, input=OutsideInput(player="p", to="innkeeper", text="hello"))
    later = [WorldArrival(tick=1, state={"king": "dead"}),
             InputArrival(tick=2, input=OutsideInput(player="q", to="smith", text="hi", id="q1"))]
    async with open_store(db) as store:
        for arrival in (first, *later):
            store.arrivals.add(arrival)
        store.arrivals.sync()
        assert read_arrivals(db, None) == [first, *later]  # on disk before any commit
        await store.end_tick(0)
        assert read_arrivals(db, None) == later  # tick 0 holds the first one now
    async with open_store(db) as store:
        assert store.arrivals.pending == later  # a resume takes these, at their ticks
        await store.end_tick(2)
    assert arrivals_path(db).read_bytes() == b""


@pytest.mark.parametrize("cut", [1, 4, 5, 20])
async def test_a_torn_last_record_is_dropped_and_the_rest_read(cut: int, tmp_path: Path) -> None:
    db = tmp_path / "tw.db"
    whole = InputArrival(tick=3, input=OutsideInput(player="p", to="innkeeper", text="a whole record"))
    async with open_store(db) as store:
        store.arrivals.add(whole)
        last = OutsideInput(player="p", to="innkeeper", text="cut short by a kill -9")
        store.arrivals.add(InputArrival(tick=3, input=last))
    path = arrivals_path(db)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - cut])  # the kill came in the middle of the last write
    assert read_arrivals(db, None) == [whole]
    async with open_store(db) as store:
        assert store.arrivals.pending == [whole]


async def test_an_input_a_tick_took_before_it_was_cut_short_is_taken_again_at_that_tick(tmp_path: Path) -> None:
    """The tick took the input (its row queued with the tick) and did not commit: its rows
    are rolled back (keep_tail=False, as after kill -9). The resumed shard takes the input
    at that same tick, from the journal, and the innkeeper answers it."""
    clock = VirtualClock(autojump=0.005)
    broker = MemoryBroker(1, clock, max_delay=0.0)
    scenario = load_scenario(VILLAGE)
    db = tmp_path / "cut.db"
    text = "A room for the night, please."
    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        stop = asyncio.Event()
        config = RunConfig(scenario=VILLAGE, run_id="mem", until_tick=12)
        async with memory_shard(broker, scenario, config, db, RunStats(), stop) as shard:
            await shard.start()
            for tick in range(3):
                assert await shard.step(tick)
            broker.accept(topics.player_input("mem", "visitor"), f'{{"to": "innkeeper", "text": "{text}"}}'.encode())
            await eventually(lambda: read_arrivals(db, 2), what="the input in the journal")
            stop.set()
            assert await shard.step(3) is False  # it took its inputs, then stopped before its turns
        taken = OutsideInput(player="visitor", to="innkeeper", text=text)
        assert read_arrivals(db, 2) == [InputArrival(tick=3, input=taken)]
        resumed = msgspec.structs.replace(config, record=RecordConfig(resume=True))
        async with memory_shard(broker, scenario, resumed, db, RunStats(), asyncio.Event()) as shard:
            await shard.start()
            assert shard.next_tick == 3
            for tick in range(3, 8):
                assert await shard.step(tick)
        server.cancel()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT tick, "
                 "input ->> 'player', input ->> 'to', input ->> 'text' FROM inputs").fetchall() == [
            (3, "visitor", "innkeeper", text)
        ]
    with open_reader(db) as reader:
        assert any(text in r.player_input for r in reader.audit_records() if r.agent_id == "innkeeper")
    assert read_arrivals(db, None) == []
