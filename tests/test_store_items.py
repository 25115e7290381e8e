"""Storage that scales: each thing stored once, records replay from their items, export by ticks."""

from __future__ import annotations

import asyncio
import gzip
import random
import sqlite3
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.store._items
from sim.audit import Attempt, AuditRecord, Response, decode_record, encode_record, make_record, replay
from sim.cli import main
from sim.memory import Belief, Episode, Line, NpcState, WorkingMemoryConfig, build_working_memory
from sim.store import HOT_LIMIT, StoreError, Writer, open_reader, open_store
from sim.store.records import Item, RecordPacker, read_packed, unpack_record
from tests.audit_records import random_record
from tests.strategies import beliefs, configs, episodes, facts, lines, player_inputs, texts, worlds
from tests.tampering import edit, reseal

CONFIG = WorkingMemoryConfig()


# A pool of items that several states draw from: what many NPCs heard, facts they share.
pools = st.fixed_dictionaries(
    {
        "facts": st.lists(facts, max_size=4, unique_by=lambda f: f.id),
        "world": st.lists(worlds, max_size=3, unique_by=lambda w: w.key),
        "episodic": st.lists(episodes, min_size=1, max_size=12),
        "beliefs": st.lists(beliefs, max_size=6),
        "dialogue": st.lists(lines, max_size=12),
    }
)


@st.composite
def shared_records(draw: st.DrawFn) -> list[AuditRecord]:
    pool = draw(pools)
    prompts = draw(st.lists(texts, min_size=1, max_size=3))
    records = []
    for n in range(draw(st.integers(min_value=1, max_value=6))):

        def pick(name: str) -> list[object]:
            items: list[object] = pool[name]
            return draw(st.lists(st.sampled_from(items), max_size=len(items))) if items else []

        state = NpcState(
            agent_id=draw(st.sampled_from(["smith", "\u5c0f\u660e"])),
            system_prompt=draw(st.sampled_from(prompts)),
            canonical_facts=tuple({f.id: f for f in pick("facts")}.values()),  # type: ignore[attr-defined]
            world_state=tuple({w.key: w for w in pick("world")}.values()),  # type: ignore[attr-defined]
            episodic=tuple(pick("episodic")),  # type: ignore[arg-type]
            beliefs=tuple(pick("beliefs")),  # type: ignore[arg-type]
            dialogue=tuple(pick("dialogue")),  # type: ignore[arg-type]
        )
        config = draw(configs())
        said = draw(player_inputs)
        try:
            wm = build_working_memory(state, said, config)
        except ValueError:
            continue  # the config's overflow policy refuses this state: nothing to record
        records.append(
            make_record(
                wm,
                id=f"inf-{n}",
                run_id="prop",
                state=state,
                config=config,
                tick=draw(st.integers(min_value=0, max_value=50)),
                response=Response(backend="scripted", model="m", line=draw(texts), fallback=draw(st.booleans()),
                                  attempts=(Attempt(prompt=wm.prompt, raw_response=draw(texts)),)),
            )
        )
    return records


def as_decoded(record: AuditRecord) -> bytes:
    """The record's encoding after a round trip through its own msgpack.

    Decoding normalizes (an int given for a float field comes back a float), so this,
    not the encoding of the record in memory, is what a stored record must match.
    """
    return encode_record(decode_record(encode_record(record)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(shared_records())
def test_packed_records_with_shared_items_replay_exactly(records: list[AuditRecord]) -> None:
    """Pure: every record rebuilds byte for byte from its blob and one shared item table."""
    packer = RecordPacker()
    table: dict[int, bytes] = {}
    blobs = []
    for record in records:
        blob, items = packer.pack(record)
        for it in items:
            assert table.setdefault(it.key, it.body) == it.body
        blobs.append(blob)
    for record, blob in zip(records, blobs, strict=True):
        columns = {name: getattr(record, name) for name in ("id", "run_id", "agent_id", "tick")}
        columns |= {"backend": record.backend, "model": record.model, "fallback": record.fallback}
        columns["line"] = record.line
        packed = read_packed(blob)
        rebuilt = unpack_record(packed, columns, {k: table[k] for k in packed.keys})
        assert encode_record(rebuilt) == as_decoded(record)
        assert replay(rebuilt).ok


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(shared_records())
def test_records_with_shared_items_replay_exactly_through_a_real_store(
    tmp_path_factory: pytest.TempPathFactory, records: list[AuditRecord]
) -> None:
    db = tmp_path_factory.mktemp("prop") / "shard.db"

    async def write() -> None:
        async with open_store(db) as store:
            for record in records:
                await store.record(record)
            await store.end_tick(0)

    asyncio.run(write())
    with open_reader(db) as reader:
        stored = {r.id: r for r in reader.audit_records()}
    first = {}
    for record in records:
        first.setdefault(record.id, record)  # the first record of an inference id wins
    assert {k: encode_record(v) for k, v in stored.items()} == {k: as_decoded(v) for k, v in first.items()}
    assert all(replay(r).ok for r in stored.values())


async def test_each_thing_is_stored_once(tmp_path: Path) -> None:
    """An episode heard by 50 agents is one item; records sharing state share items."""
    db = tmp_path / "shard.db"
    agents = [f"npc{i}" for i in range(50)]
    async with open_store(db) as store:
        for agent in agents:
            await store.ensure_agent(NpcState(agent_id=agent, system_prompt="You are an NPC."), writer=Writer.SCENARIO)
        for tick in range(1, 4):
            said = Episode(id=f"ev{tick}", tick=tick, text=f"the bell rang {tick} times", significance=0.3)
            for agent in agents:
                await store.add_episode(agent, said, writer=Writer.NPC)
            await store.end_tick(tick)
        for n in range(40):
            state = store.state(agents[n % 2])
            memory = build_working_memory(state, "hello", CONFIG)
            record = make_record(
                memory, id=f"inf-{n}", run_id="r", state=state, config=CONFIG,
                tick=4, response=Response(backend="scripted", model="m", line="Good day."),
            )  # fmt: skip
            await store.record(record)
        await store.end_tick(4)
    with sqlite3.connect(db) as conn:
        heard = conn.execute("SELECT count(*), sum(length(items) / 8) FROM heard").fetchone()
        bodies = [bytes(body) for (body,) in conn.execute("SELECT body FROM items")]
    conn.close()
    # one heard row per agent and tick, one item per episode, shared by the 40 records too
    assert heard == (150, 150)
    # three episodes, one system prompt, one config, one compression template
    bells = {msgspec.msgpack.encode(Episode(id=f"ev{t}", tick=t, text=f"the bell rang {t} times", significance=0.3))
             for t in range(1, 4)}  # fmt: skip
    assert len(bodies) == 6 and bells < set(bodies) and msgspec.msgpack.encode("You are an NPC.") in bodies
    with open_reader(db) as reader:
        assert all(replay(r).ok for r in reader.audit_records())


async def test_a_digest_collision_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two different items under one key: the writer refuses the batch, nothing wrong is stored."""

    def colliding(body: bytes) -> Item:
        return Item(7, hash(body), body)

    monkeypatch.setattr(sim.store._items, "item", colliding)
    db = tmp_path / "shard.db"
    with pytest.raises(StoreError, match="two different items with the digest key 7"):
        async with open_store(db) as store:
            await store.ensure_agent(NpcState(agent_id="a", system_prompt="p"), writer=Writer.SCENARIO)
            await store.add_episode("a", Episode(id="e1", tick=1, text="one"), writer=Writer.NPC)
            await store.add_episode("a", Episode(id="e2", tick=1, text="two"), writer=Writer.NPC)
            await store.end_tick(1)
    # and the database's own check, for a key written by an earlier process
    with sqlite3.connect(db) as conn, pytest.raises(sqlite3.IntegrityError, match="same digest key"):
        conn.execute("INSERT INTO items (k, body) VALUES (1, x'01')")
        conn.execute("INSERT OR IGNORE INTO items (k, body) VALUES (1, x'02')")
    conn.close()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("UPDATE audit SET record = x'c1c1'", "cannot decode the stored record"),
        ("DELETE FROM items", "references item"),
    ],
)
async def test_a_damaged_packed_record_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, message: str
) -> None:
    db = tmp_path / "shard.db"
    async with open_store(db) as store:
        await store.record(random_record(random.Random(1), 0))
    edit(db, damage)
    reseal(db)  # as its writer would have sealed it: the damage, not the broken chain, is what replay meets
    assert main(["audit", "replay", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("npcsim: error:") and "inf-00000" in err and message in err
    assert len(err.strip().splitlines()) == 1


async def test_export_by_tick_range_to_gzip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "shard.db"
    rng = random.Random(2)
    records = [random_record(rng, n) for n in range(250)]  # ticks 0..9
    async with open_store(db) as store:
        for record in records:
            await store.record(record)
    out = tmp_path / "ticks-3-5.jsonl.gz"
    assert main(["audit", "export", "--db", str(db), "--from-tick", "3", "--to-tick", "5", "--out", str(out)]) == 0
    decoder = msgspec.json.Decoder(AuditRecord)
    exported = [decoder.decode(line) for line in gzip.decompress(out.read_bytes()).splitlines()]
    wanted = sorted((r for r in records if 3 <= r.tick <= 5), key=lambda r: (r.tick, r.agent_id, r.id))
    assert [r.id for r in exported] == [r.id for r in wanted] and len(exported) == 75
    assert [encode_record(r) for r in exported] == [encode_record(r) for r in wanted]
    capsys.readouterr()
    for argv, complaint in (
        (["--from-tick", "-1"], "--from-tick must be >= 0, got -1"),
        (["--to-tick", "-3"], "--to-tick must be >= 0, got -3"),
        (["--from-tick", "6", "--to-tick", "5"], "--from-tick 6 is after --to-tick 5"),
    ):
        assert main(["audit", "export", "--db", str(db), "--out", str(tmp_path / "x.jsonl"), *argv]) == 2
        assert capsys.readouterr().err.strip() == f"npcsim: error: {complaint}"
    assert not (tmp_path / "x.jsonl").exists()


async def test_pruning_keeps_exactly_what_loading_needs(tmp_path: Path) -> None:
    """After prune_memories(keep) a reload gives the same hot state; older rows are gone."""
    db = tmp_path / "shard.db"
    rng = random.Random(8)
    async with open_store(db) as store:
        for a in range(3):
            await store.ensure_agent(NpcState(agent_id=f"npc{a}", system_prompt="p"), writer=Writer.SCENARIO)
        for tick in range(40):
            for a in range(3):
                # several episodes per tick, ids in random order, sometimes none
                for _ in range(rng.choice([0, 1, 3, 7])):
                    episode = Episode(id=f"e{rng.randrange(1000):03d}", tick=tick, text=f"heard at {tick}")
                    await store.add_episode(f"npc{a}", episode, writer=Writer.NPC)
                belief = Belief(id=f"b{tick}", tick=tick, text=f"belief {tick}")
                await store.add_belief(f"npc{a}", belief, writer=Writer.NPC)
                await store.add_line(f"npc{a}", Line(tick=tick, speaker="p", text=f"line {tick}"), writer=Writer.NPC)
            await store.end_tick(tick)
        expected = {f"npc{a}": store.state(f"npc{a}") for a in range(3)}
        with pytest.raises(StoreError, match="below the hot limit 32"):
            await store.prune_memories(31)
        deleted = await store.prune_memories(HOT_LIMIT)
        await store.flush()
        assert store.statistics().rows_pruned == deleted > 0
    with sqlite3.connect(db) as conn:
        kept = dict(conn.execute("SELECT agent, sum(length(items) / 8) FROM heard GROUP BY agent").fetchall())
        per_tick = dict(conn.execute("SELECT agent, count(*) FROM beliefs GROUP BY agent").fetchall())
    conn.close()
    assert all(HOT_LIMIT <= n < HOT_LIMIT + 7 for n in kept.values()), kept  # at most a tick's worth more
    assert set(per_tick.values()) == {HOT_LIMIT}
    async with open_store(db) as store:
        await store.load_agents(expected)
        assert {a: store.state(a) for a in expected} == expected


async def test_export_rotate_deletes_what_was_exported_and_the_rest_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "shard.db"
    rng = random.Random(4)
    records = [random_record(rng, n) for n in range(250)]  # ticks 0..9
    async with open_store(db) as store:
        for record in records:
            await store.record(record)
    archive = tmp_path / "ticks-0-4.jsonl.gz"
    assert main(["audit", "export", "--db", str(db), "--to-tick", "4", "--out", str(archive), "--rotate"]) == 0
    assert "deleted 125 exported records" in capsys.readouterr().err
    decoder = msgspec.json.Decoder(AuditRecord)
    exported = [decoder.decode(line) for line in gzip.decompress(archive.read_bytes()).splitlines()]
    assert len(exported) == 125 and all(r.tick <= 4 for r in exported) and all(replay(r).ok for r in exported)
    with open_reader(db) as reader:
        left = list(reader.audit_records())
    assert len(left) == 125 and all(r.tick >= 5 for r in left)
    assert main(["audit", "replay", "--db", str(db)]) == 0
    assert "replayed 125 records: all byte-identical" in capsys.readouterr().out
    # without a file to keep them in, nothing is deleted
    assert main(["audit", "export", "--db", str(db), "--rotate"]) == 2
    assert capsys.readouterr().err.strip() == (
        "npcsim: error: --rotate needs --out: records are deleted only once they are in a file"
    )
    with open_reader(db) as reader:
        assert len(list(reader.audit_records())) == 125
