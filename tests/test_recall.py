"""Recall from an NPC's whole history: what is kept, what is brought back, how a place's talk is folded.

The pure parts (sim.memory recall and summary_of) as properties; keeping on a real SQLite
store, bounded and the same after reopening; a place's chronicle folding and resuming
exactly; and on a live run (real Mosquitto), every summary traced to the events it folds.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.memory import (
    FOLD_EVENTS,
    KEEP_SIGNIFICANCE,
    MAX_KEPT,
    Episode,
    NpcState,
    recall,
    summary_of,
    with_recalled,
)
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, run
from sim.shard._chronicle import Chronicle
from sim.store import Writer, open_reader, open_store
from sim.store.records import unpack_keys
from sim.wire.events import AnyEvent, Notice, Speech
from tests.helpers import MosquittoProcess, npcsim_in_process, recall_world
from tests.store_states import village_state

SECRET = Episode(id="ev:secret", tick=5, text='p0 said to me: "I buried the silver relic under the old oak."',
                 significance=0.9, event="secret")
CHATTER = tuple(
    Episode(id=f"ev:c{i}", tick=10 + i, text=f'n{i % 7} said to me: "The price of flour rose again, {i}."',
            significance=0.7, event=f"c{i}")
    for i in range(40)
)


def test_a_question_recalls_the_memory_that_answers_it() -> None:
    assert recall((*CHATTER, SECRET), "Where did I say I buried the silver relic?", 3) == (SECRET,)
    # an unrelated question recalls nothing of it; a question of common words only, nothing at all
    assert SECRET not in recall((*CHATTER, SECRET), "What is the price of bread today?", 8)
    assert recall((*CHATTER, SECRET), "What did you say to me?", 8) == ()


def test_recall_skips_what_the_state_holds_and_what_the_dialogue_says() -> None:
    question = "the silver relic"
    assert recall((SECRET,), question, 3, present={"ev:secret"}) == ()
    assert recall((SECRET,), question, 3, said={"secret"}) == ()
    assert recall((SECRET,), question, 0) == ()


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(min_value=1, max_value=12))
def test_recall_is_a_function_of_the_kept_set_not_of_its_order(rng: random.Random, top: int) -> None:
    kept = [*CHATTER, SECRET]
    first = recall(kept, "flour price relic", top)
    rng.shuffle(kept)
    assert recall(kept, "flour price relic", top) == first
    assert len(first) <= top and list(first) == sorted(first, key=lambda e: (e.tick, e.id))


def test_recalled_memories_join_the_state_in_recency_order() -> None:
    state = NpcState(agent_id="n0", system_prompt="You are n0.", episodic=CHATTER[-3:])
    joined = with_recalled(state, (SECRET,))
    assert joined.episodic == (SECRET, *CHATTER[-3:]) and with_recalled(state, ()) is state


def test_a_summary_names_its_place_and_ticks_and_is_short_whatever_was_said() -> None:
    said = [(f"n{i % 3}", "word " * 200) for i in range(50)] + [("", "The bell rang at noon.")]
    summary = summary_of("l0", 12, 40, said)
    assert summary.id == "sum:l0:12-40" and summary.tick == 40 and summary.event is None
    assert summary.text.startswith("Heard at l0, ticks 12-40: 51 lines, most from n0 (17), n1 (17), n2 (16)")
    assert len(summary.text) < 300 and summary == summary_of("l0", 12, 40, said)
    assert summary.significance < KEEP_SIGNIFICANCE


async def test_keeping_is_bounded_keeps_the_strongest_and_survives_reopening(tmp_path: Path) -> None:
    db = tmp_path / "kept.db"
    async with open_store(db) as store:
        await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
        await store.add_episode("smith", Episode(id="small", tick=1, text="Sold a nail.", significance=0.3),
                                writer=Writer.NPC)
        await store.keep("smith", SECRET, writer=Writer.NPC)
        for i in range(MAX_KEPT + 20):
            await store.keep("smith", Episode(id=f"k{i}", tick=10 + i, text=f"Heard {i}.", significance=0.85),
                             writer=Writer.NPC)
        await store.keep("smith", SECRET, writer=Writer.NPC)  # kept once
        kept = list(store.kept("smith"))
        await store.end_tick(400)
    assert len(kept) == MAX_KEPT and "small" not in {e.id for e in kept}
    assert SECRET in kept and len({e.id for e in kept}) == MAX_KEPT
    assert {e.id for e in kept} - {"ev:secret"} == {f"k{i}" for i in range(21, MAX_KEPT + 20)}  # the oldest gave way
    async with open_store(db) as store:
        await store.load_agents(["smith"])
        assert list(store.kept("smith")) == kept


def _speech(tick: int, n: int) -> Speech:
    return Speech(id=f"e{tick}-{n}", tick=tick, location="l0", speaker=f"n{n}", to=f"n{n + 1}",
                  text=f"Line {tick} {n}.")


def test_a_chronicle_folds_every_fold_of_events_and_resumes_exactly() -> None:
    ticks = [[_speech(t, n) for n in range(3)] for t in range(60)]
    whole, folded = Chronicle("l0"), []
    for events in ticks:
        if (summary := whole.append(events)) is not None:
            folded.append(summary)
    assert [s.slot for s in folded] == list(range(len(folded))) and len(folded) == 180 // FOLD_EVENTS
    assert all(len(s.events) >= FOLD_EVENTS for s in folded)
    every = [e.id for t in ticks for e in t]
    assert [e for s in folded for e in s.events] == every[: sum(len(s.events) for s in folded)]
    # a shard resumed after tick 30: its summaries restored, the place's log appended from its since
    resumed = Chronicle("l0")
    done = [s for s in folded if s.episode.tick <= 30]
    resumed.restore(done)
    since = min(e.tick for e in (e for t in ticks[:31] for e in t) if e.id not in {i for s in done for i in s.events})
    again = [s for events in ticks[since:] if (s := resumed.append(events)) is not None]
    assert [*done, *again] == folded and resumed.summaries == whole.summaries


def test_a_notice_is_in_the_summary_of_its_place() -> None:
    chronicle = Chronicle("l0")
    notice = Notice(id="bell", tick=0, location="l0", text="The bell rang.", significance=0.9)
    summary = chronicle.append([notice, *(_speech(0, n) for n in range(FOLD_EVENTS - 1))])
    assert summary is not None and summary.events[0] == "bell"


@pytest.mark.mosquitto
@pytest.mark.timeout(120)
async def test_every_summary_of_a_live_run_is_traced_to_the_events_it_folds(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    db = tmp_path / "recall.db"
    config = RunConfig(scenario=recall_world(tmp_path), broker=BrokerConfig(url=mosquitto.url), run_id="traced",
                       until_tick=50, record=RecordConfig(db=str(db)))
    await run(config, stats=RunStats())
    async with open_store(db) as store:
        summaries = await store.summaries()
    said = place_events(db)
    assert set(summaries) == {"l0", "l1", "l2"}
    for place, found in summaries.items():
        assert [s.slot for s in found] == list(range(len(found))) and len(found) >= 2
        for summary in found:
            first, last = (int(t) for t in summary.episode.id.rsplit(":", 1)[1].split("-"))
            ids = [event.id for tick in range(first, last + 1) for event in said.get((place, tick), ())]
            assert list(summary.events) == ids, f"{summary.episode.id} folds other events than its ticks'"
            assert summary.episode.text.startswith(f"Heard at {place}, ticks {first}-{last}: {len(ids)} lines")


@pytest.mark.mosquitto
@pytest.mark.timeout(180)
async def test_a_run_that_recalls_replays_identical_and_a_what_if_turns_recall_off(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "recall.db"
    config = RunConfig(scenario=recall_world(tmp_path), broker=BrokerConfig(url=mosquitto.url), run_id="again",
                       until_tick=70, record=RecordConfig(db=str(db)))
    await run(config, stats=RunStats())
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    recalled = [r for r in records if r.recalled]
    assert recalled and any(i.startswith("sum:") for r in recalled for i in r.recalled)
    again = await asyncio.to_thread(npcsim_in_process, capsys, "replay", "--db", str(db))
    assert again.code == 0 and again.out.strip() == f"identical: {len(records)} records, 24 NPCs, 70 ticks", again
    off = await asyncio.to_thread(npcsim_in_process, capsys, "replay", "--db", str(db), "--set",
                                  "memory.scored.recall=0", "--examples", "1")
    assert off.code == 0, off.err
    header, variant = off.out.splitlines()[:2]
    row = dict(zip(header.split("\t"), variant.split("\t"), strict=True))
    assert row["variant"] == "memory.scored.recall=0" and int(row["prompts changed"]) > 0
    assert int(row["items lost"]) > 0, "turning recall off lost nothing it had brought back"
    lost = [line for line in off.out.splitlines() if "\tepisodic\tlost\t" in line]
    assert lost and any(i in lost[0] for r in recalled for i in r.recalled), lost
    anew = await asyncio.to_thread(npcsim_in_process, capsys, "replay", "--db", str(db), "--set",
                                   "memory.scored.recall=3")
    assert anew.code == 2 and len(anew.err.strip().splitlines()) == 1 and "--fork-at" in anew.err


def place_events(db: Path) -> dict[tuple[str, int], list[AnyEvent]]:
    """Every place's logged events by (place, tick), read from the file as it is laid out (docs/store.md)."""
    decoder = msgspec.msgpack.Decoder(AnyEvent)
    with sqlite3.connect(db) as conn:
        bodies = dict(conn.execute("SELECT k, body FROM items"))
        rows = conn.execute("SELECT place, tick, items FROM place_events ORDER BY place, tick, rowid").fetchall()
    found: dict[tuple[str, int], list[AnyEvent]] = {}
    for place, tick, blob in rows:
        found.setdefault((place, tick), []).extend(decoder.decode(bodies[k]) for k in unpack_keys(blob))
    return found
