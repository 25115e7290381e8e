"""sim.store on real SQLite files: authority, bounded hot state, schema refusal."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from sim.errors import AuthorityError, SchemaError, StoreError
from sim.memory import Belief, Episode, Fact, Line, NpcState, WorldFact, build_working_memory
from sim.protocol.outside import InputArrival
from sim.store import (
    HOT_LIMIT,
    SCHEMA_VERSION,
    Pending,
    TickRecord,
    Writer,
    open_reader,
    open_store,
    read_arrivals,
)
from sim.wire.inputs import OutsideInput
from tests.helpers import eventually, fingerprint
from tests.store_states import village_state


async def test_state_survives_reopen(tmp_path: Path) -> None:
    db = tmp_path / "shard.db"
    async with open_store(db) as store:
        assert await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
        assert not await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
        await store.add_fact("smith", Fact(id="queen", text="The queen rules."), writer=Writer.GAME)
        await store.set_world("smith", WorldFact(key="weather", value="sun"), writer=Writer.GAME)
        await store.add_episode("smith", Episode(id="e1", tick=3, text="Sold a horseshoe."), writer=Writer.NPC)
        await store.add_belief("smith", Belief(id="b1", tick=3, text="Rain is coming."), writer=Writer.NPC)
        await store.add_line("smith", Line(tick=3, speaker="smith", text="Good day."), writer=Writer.NPC)
        await store.end_tick(3)
        before = store.state("smith")
    async with open_store(db) as store:
        assert store.last_tick == 3
        assert await store.load_agents(["smith", "ghost"]) == ("ghost",)
        assert store.state("smith") == before
        # an existing agent is not overwritten by a later ensure_agent
        assert not await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
        assert store.state("smith").world_state == (WorldFact(key="weather", value="sun"),)


async def test_exit_flushes_without_end_tick(tmp_path: Path) -> None:
    db = tmp_path / "shard.db"
    async with open_store(db) as store:
        await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
        await store.add_episode("smith", Episode(id="e9", tick=9, text="late"), writer=Writer.NPC)
    async with open_store(db) as store:
        await store.load_agents(["smith"])
        assert store.state("smith").episodic[-1].id == "e9"
        assert store.last_tick is None


@pytest.mark.parametrize(
    ("category", "writer"),
    [
        ("canonical_facts", Writer.NPC),
        ("world_state", Writer.NPC),
        ("world_state", Writer.SCENARIO),
        ("episodic", Writer.GAME),
        ("beliefs", Writer.SCENARIO),
        ("dialogue", Writer.GAME),
    ],
)
async def test_authority_violations_raise_and_are_counted(tmp_path: Path, category: str, writer: Writer) -> None:
    db = tmp_path / "shard.db"
    writes = {
        "canonical_facts": lambda s: s.add_fact("smith", Fact(id="lie", text="The smith is king."), writer=writer),
        "world_state": lambda s: s.set_world("smith", WorldFact(key="weather", value="gold"), writer=writer),
        "episodic": lambda s: s.add_episode("smith", Episode(id="x", tick=1, text="x"), writer=writer),
        "beliefs": lambda s: s.add_belief("smith", Belief(id="x", tick=1, text="x"), writer=writer),
        "dialogue": lambda s: s.add_line("smith", Line(tick=1, speaker="s", text="x"), writer=writer),
    }
    async with open_store(db) as store:
        await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
        before = store.state("smith")
        with pytest.raises(AuthorityError) as caught:
            await writes[category](store)
        message = str(caught.value)
        assert "'smith'" in message and category in message and writer.name in message
        assert store.statistics().authority_violations == 1
        assert store.state("smith") == before
    async with open_store(db) as store:
        await store.load_agents(["smith"])
        assert store.state("smith") == before


async def test_canonical_facts_are_add_only(tmp_path: Path) -> None:
    async with open_store(tmp_path / "shard.db") as store:
        await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
        await store.add_fact("smith", Fact(id="king", text="The king is dead."), writer=Writer.GAME)
        with pytest.raises(AuthorityError, match="'king' exists"):
            await store.add_fact("smith", Fact(id="king", text="The king lives."), writer=Writer.SCENARIO)
        with pytest.raises(AuthorityError, match="NPC may not write agent"):
            await store.ensure_agent(village_state("apprentice"), writer=Writer.NPC)
        assert store.statistics().authority_violations == 2
        assert store.state("smith").canonical_facts == (Fact(id="king", text="The king is dead."),)


async def test_unknown_agent_and_tick_order_are_refused(tmp_path: Path) -> None:
    async with open_store(tmp_path / "shard.db") as store:
        with pytest.raises(StoreError, match="'ghost' is not loaded"):
            await store.add_episode("ghost", Episode(id="x", tick=1, text="x"), writer=Writer.NPC)
        await store.end_tick(5)
        with pytest.raises(StoreError, match=r"end_tick\(4\) after tick 5"):
            await store.end_tick(4)


async def test_hot_state_is_bounded_with_a_long_history(tmp_path: Path) -> None:
    db = tmp_path / "shard.db"
    rng = random.Random(7)
    episodes = [Episode(id=f"e{i:05d}", tick=rng.randrange(5000), text=f"memory {i}") for i in range(10_000)]
    lines = [Line(tick=rng.randrange(5000), seq=rng.randrange(3), speaker="p", text=f"l{i}") for i in range(10_000)]
    base = village_state()
    async with open_store(db) as store:
        await store.ensure_agent(NpcState(agent_id="smith", system_prompt=base.system_prompt), writer=Writer.SCENARIO)
        for episode, line in zip(episodes, lines, strict=True):
            await store.add_episode("smith", episode, writer=Writer.NPC)
            await store.add_line("smith", line, writer=Writer.NPC)
        await store.end_tick(5000)
        hot = store.state("smith")
    full = NpcState(agent_id="smith", system_prompt=base.system_prompt, episodic=tuple(episodes), dialogue=tuple(lines))
    assert len(hot.episodic) == HOT_LIMIT and len(hot.dialogue) == HOT_LIMIT
    assert hot.episodic == full.episodic[-HOT_LIMIT:]
    assert hot.dialogue == full.dialogue[-HOT_LIMIT:]
    # the working memory built from the bounded state keeps exactly what the full one keeps
    assert build_working_memory(hot, "hi").prompt == build_working_memory(full, "hi").prompt
    async with open_store(db) as store:
        await store.load_agents(["smith"])
        assert store.state("smith") == hot
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT sum(length(items) / 8) FROM heard").fetchone() == (10_000,)


async def test_many_agents_load_in_a_bounded_number_of_queries(tmp_path: Path) -> None:
    db = tmp_path / "shard.db"
    ids = [f"npc{i}" for i in range(300)]
    async with open_store(db) as store:
        for agent_id in ids:
            await store.ensure_agent(village_state(agent_id), writer=Writer.SCENARIO)
            for i in range(HOT_LIMIT + 5):
                await store.add_belief(agent_id, Belief(id=f"b{i}", tick=i, text=f"b{i}"), writer=Writer.NPC)
        await store.end_tick(1)
        expected = {agent_id: store.state(agent_id) for agent_id in ids}
    async with open_store(db) as store:
        statements: list[str] = []
        await store._conn.set_trace_callback(statements.append)
        assert await store.load_agents(ids) == ()
        await store._conn.set_trace_callback(None)
        assert len(statements) == 8  # five tables, heard rows and their items, kept episodes
        assert {agent_id: store.state(agent_id) for agent_id in ids} == expected


async def test_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "future.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = fingerprint(db)
    with pytest.raises(SchemaError, match="newer than this npcsim supports"):
        async with open_store(db):
            pass
    with pytest.raises(SchemaError, match="newer"), open_reader(db):
        pass
    assert fingerprint(db) == before


@pytest.mark.parametrize(
    "content",
    [b"this is a text file, not a database\n" * 10, b"SQLite format 3\x00" + b"\x00" * 20, b"\x00" * 4096],
)
async def test_not_a_database_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    db = tmp_path / "notes.db"
    db.write_bytes(content)
    before = fingerprint(db)
    with pytest.raises(SchemaError, match="not an SQLite database"):
        async with open_store(db):
            pass
    assert fingerprint(db) == before


async def test_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE other_app (x)")
    conn.close()
    before = fingerprint(db)
    with pytest.raises(SchemaError, match="not an npcsim store"):
        async with open_store(db):
            pass
    assert fingerprint(db) == before


async def test_error_in_the_block_still_flushes_and_propagates_unwrapped(tmp_path: Path) -> None:
    db = tmp_path / "shard.db"
    with pytest.raises(ZeroDivisionError):
        async with open_store(db) as store:
            await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
            1 / 0  # noqa: B018
    async with open_store(db) as store:
        assert await store.load_agents(["smith"]) == ()


async def test_without_keep_tail_an_unfinished_tick_is_rolled_back(tmp_path: Path) -> None:
    """The runner's store: after a crash of any kind, only whole ticks are on disk."""
    db = tmp_path / "shard.db"
    with pytest.raises(ZeroDivisionError):
        async with open_store(db, keep_tail=False) as store:
            await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
            await store.resume.record_input(0, OutsideInput(seq=0, player="visitor", to="smith",
                                                            text="A sword, please."))
            kept = TickRecord(sent=[(0, "npcsim/r/loc/forge/events", b"\x01\x02")], says=[], pending=Pending())
            await (await store.commit_tick(0, kept))
            batches = store.statistics().batches
            await store.add_episode("smith", Episode(id="e1", tick=1, text="half a tick"), writer=Writer.NPC)
            await store.resume.record_input(1, OutsideInput(seq=0, player="visitor", to="smith", text="Hello again"))
            await store.resume.keep(TickRecord(sent=[(0, "npcsim/r/loc/forge/events", b"\x01\x02"),
                                                     (1, "npcsim/r/loc/x", b"\x03")], says=[], pending=Pending()))
            await eventually(lambda: store.statistics().batches > batches,
                             what="the writer running the queued rows inside the open transaction")
            1 / 0  # noqa: B018
    async with open_store(db, keep_tail=False) as store:
        assert store.last_tick == 0
        await store.load_agents(["smith"])
        assert [e.id for e in store.state("smith").episodic] == ["e0"]
        assert await store.resume.inputs(0) == [OutsideInput(seq=0, player="visitor", to="smith",
                                                              text="A sword, please.")]
        assert await store.resume.inputs(1) == []
        assert await store.resume.sent() == [(0, "npcsim/r/loc/forge/events", b"\x01\x02")]


@pytest.mark.parametrize("nul", [False, True], ids=["bulk", "row-by-row"])
async def test_a_belief_written_again_replaces_the_one_with_its_id(tmp_path: Path, nul: bool) -> None:
    """One belief per id, on disk and in the hot state alike: refreshed a hundred times it is
    one row, its newest; a restart loads exactly the state the running store had."""
    db = tmp_path / "shard.db"
    text = "player wants to talk to me." + ("\x00" if nul else "")  # a NUL sends rows one at a time
    async with open_store(db) as store:
        await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
        authored = store.state("smith").beliefs
        for tick in range(100):
            await store.add_belief("smith", Belief(id="talk:player", tick=tick, text=text), writer=Writer.NPC)
            if tick % 7 == 0:
                await store.add_belief("smith", Belief(id=f"b-new{tick}", tick=tick, text="x"), writer=Writer.NPC)
                await store.add_belief("smith", Belief(id="talk:player", tick=tick, text=text), writer=Writer.NPC)
            if tick % 10 == 9:
                await store.end_tick(tick)
        hot = store.state("smith")
    assert [b.id for b in hot.beliefs].count("talk:player") == 1
    assert hot.beliefs[-1] == Belief(id="talk:player", tick=99, text=text)
    async with open_store(db) as store:
        await store.load_agents(["smith"])
        assert store.state("smith") == hot
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, tick FROM beliefs WHERE agent = 'smith' AND id = 'talk:player'").fetchall()
        assert rows == [("talk:player", 99)]
        assert conn.execute("SELECT count(*) FROM beliefs").fetchone() == (len(authored) + 1 + 15,)


async def test_commit_tick_puts_the_tick_and_what_it_replaces_on_disk_together(tmp_path: Path) -> None:
    """`commit_tick` queues what the tick replaces, flushes the arrivals it took, commits; the
    journal then drops what the tick holds, and a reopened store reads the rest back."""
    db = tmp_path / "tw.db"
    taken = InputArrival(tick=0, input=OutsideInput(player="p", to="smith", text="hi"))
    later = InputArrival(tick=1, input=OutsideInput(player="p", to="smith", text="later"))
    record = TickRecord(sent=[(0, "npcsim/r/loc/forge/events", b"\x01")], says=[("npcsim/r/agent/smith/say", b"y")],
                        pending=Pending(world={"weather": "rain"}))
    async with open_store(db, keep_tail=False) as store:
        store.arrivals.add(taken)
        store.arrivals.add(later)
        await (await store.commit_tick(0, record))
        assert read_arrivals(db, None) == [later]
    async with open_store(db, keep_tail=False) as store:
        assert store.last_tick == 0
        assert store.arrivals.pending == [later]
        assert await store.resume.sent() == record.sent
        assert await store.resume.says() == record.says
        assert await store.resume.pending() == record.pending


async def test_only_the_game_replaces_or_withdraws_a_fact_and_a_withdrawn_one_stays_gone(tmp_path: Path) -> None:
    db = tmp_path / "facts.db"
    async with open_store(db) as store:
        await store.ensure_agent(village_state(), writer=Writer.SCENARIO)
        await store.add_fact("smith", Fact(id="queen", text="The queen rules."), writer=Writer.GAME)
        for writer in (Writer.NPC, Writer.SCENARIO):
            with pytest.raises(AuthorityError):
                await store.replace_fact("smith", Fact(id="king", text="The king lives."), writer=writer)
            with pytest.raises(AuthorityError):
                await store.withdraw_fact("smith", "king", writer=writer)
        with pytest.raises(StoreError, match="holds no fact 'prince'"):
            await store.withdraw_fact("smith", "prince", writer=Writer.GAME)
        await store.replace_fact("smith", Fact(id="king", text="The king lives."), writer=Writer.GAME)
        await store.withdraw_fact("smith", "queen", writer=Writer.GAME)
        await store.end_tick(1)
        facts = store.state("smith").canonical_facts
    assert facts == (Fact(id="king", text="The king lives."),)
    async with open_store(db) as store:
        await store.load_agents(["smith"])
        assert store.state("smith").canonical_facts == facts
        await store.add_fact("smith", Fact(id="queen", text="A new queen rules."), writer=Writer.GAME)  # again
        await store.end_tick(2)
    async with open_store(db) as store:
        await store.load_agents(["smith"])
        assert [f.text for f in store.state("smith").canonical_facts] == ["The king lives.", "A new queen rules."]
