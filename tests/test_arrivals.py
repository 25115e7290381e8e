"""The arrivals journal (sim.store._arrivals): kept until its tick commits, read back whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.store import PlayerArrival, WorldArrival, arrivals_path, open_store, read_arrivals


async def test_arrivals_stay_until_their_tick_commits_and_a_reopened_store_has_them(tmp_path: Path) -> None:
    db = tmp_path / "tw.db"
    first = PlayerArrival(tick=0, player="p", to="innkeeper", text="hello")
    later = [WorldArrival(tick=1, state={"king": "dead"}), PlayerArrival(tick=2, player="q", to="smith", text="hi")]
    async with open_store(db) as store:
        for arrival in (first, *later):
            store.arrive(arrival)
        await store.sync_arrivals()
        assert read_arrivals(db, None) == [first, *later]  # on disk before any commit
        await store.end_tick(0)
        assert read_arrivals(db, None) == later  # tick 0 holds the first one now
    async with open_store(db) as store:
        assert store.pending_arrivals == later  # a resume takes these, at their ticks
        await store.end_tick(2)
    assert arrivals_path(db).read_bytes() == b""


@pytest.mark.parametrize("cut", [1, 4, 5, 20])
async def test_a_torn_last_record_is_dropped_and_the_rest_read(cut: int, tmp_path: Path) -> None:
    db = tmp_path / "tw.db"
    whole = PlayerArrival(tick=3, player="p", to="innkeeper", text="a whole record")
    async with open_store(db) as store:
        store.arrive(whole)
        store.arrive(PlayerArrival(tick=3, player="p", to="innkeeper", text="cut short by a kill -9"))
    path = arrivals_path(db)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - cut])  # the kill came in the middle of the last write
    assert read_arrivals(db, None) == [whole]
    async with open_store(db) as store:
        assert store.pending_arrivals == [whole]
