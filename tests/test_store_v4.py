"""Schema 4 (issue 20): the places' logs, bulk writes, and stores written before it.

A store written by npcsim before schema 4 (tests/golden/village-schema3-tick60.sqlite: the
village's golden run stopped after tick 60, by the engine before the rebuild) migrates,
resumes and continues, with the fact guard of its time (tests/first_fact_guard.py, plugged
in), to exactly the pinned audit tests/golden/audit-village-guard1.tsv. Its own records
were rendered by renderer 2, the golden's by renderer 3, which changed only the working
memory's encoding: those records match the golden in every digest but that one. The
records after tick 60 are today's NPC brain and scripted backend continuing from the
stored state (regenerated with NPCSIM_REGENERATE_GOLDEN=1 when what NPCs say changes: the
stored records' lines are kept as they are).
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from sim.errors import ConfigError
from sim.inference import contradicted_fact
from sim.memory import Fact
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, run
from sim.store import SCHEMA_VERSION, open_reader, open_store
from sim.store.sql import BULK, INSERT, bulk_parameters
from sim.wire.events import Notice, Speech
from tests import first_fact_guard
from tests.golden import AUDIT_COLUMNS, GOLDEN, REGENERATE, audit_lines
from tests.helpers import REPO, MosquittoProcess

SCHEMA_3 = GOLDEN / "village-schema3-tick60.sqlite"
# Up to tick 60: the village's uninterrupted run, renderer 3, with the first fact guard
# (tests/first_fact_guard.py), as tests/golden/audit-village.tsv was before the built-in guard
# accepted a restated fact. After it: the continuation of the stored run with that guard, by
# today's brain and backend (since issue 22 changed what NPCs say, it no longer equals any
# uninterrupted run: the stored state holds the old brain's beliefs and memories).
GOLDEN_FIRST_GUARD = GOLDEN / "audit-village-guard1.tsv"


def test_bulk_statements_store_exactly_what_one_row_at_a_time_stores() -> None:
    rng = random.Random(4)
    texts = ["", "plain", "line\nbreak \u2028 \"quoted\" \\ back", "\x01\x1f\x7f \U0001f600 é", "x" * 5000,
             "<|im_start|>", "123", "null"]
    rows = {
        "line": [(f"n{i}", rng.randrange(100), i, rng.choice(texts), rng.choice(texts)) for i in range(50)],
        "belief": [(f"n{i}", rng.choice(texts), i, rng.choice(texts), rng.random()) for i in range(50)],
        "item": [(rng.getrandbits(63) - 2**62, rng.randbytes(rng.randrange(0, 300))) for _ in range(50)],
        "audit": [(f"r:n{i}:0:1", "r", f"n{i}", 0, "scripted", rng.choice(texts), bool(i % 2), rng.choice(texts),
                   rng.randbytes(40)) for i in range(50)],
        "place_window": [(f"p{i}", i) for i in range(10)],
    }
    with sqlite3.connect(SCHEMA_3) as schema_3:
        ddl = [sql for (sql,) in schema_3.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")]
    got = {}
    for how in ("one at a time", "bulk"):
        conn = sqlite3.connect(":memory:", isolation_level=None)
        for statement in ddl:
            conn.execute(statement)
        conn.execute("CREATE TABLE place_windows (place TEXT PRIMARY KEY, since INTEGER NOT NULL) WITHOUT ROWID")
        for kind, group in rows.items():
            if how == "bulk":
                parameters = bulk_parameters(kind, group)  # type: ignore[arg-type]
                assert parameters is not None
                conn.execute(BULK[kind], parameters)  # type: ignore[index]
            else:
                conn.executemany(INSERT[kind], group)  # type: ignore[index]
        got[how] = {table: conn.execute(f"SELECT *, typeof({column}) FROM {table} ORDER BY rowid").fetchall()
                    for table, column in (("dialogue", "text"), ("beliefs", "confidence"), ("items", "body"),
                                          ("audit", "fallback"))}
        got[how]["place_windows"] = conn.execute("SELECT * FROM place_windows ORDER BY place").fetchall()
    assert got["bulk"] == got["one at a time"]
    assert got["bulk"]["dialogue"] and got["bulk"]["items"]
    # a NUL character would be cut by SQLite's JSON functions: such rows go one at a time
    assert bulk_parameters("line", [("n1", 1, 1, "p", "cut \x00 here")]) is None
    assert bulk_parameters("line", [("n1", 1, 1, "p", "a written \\u0000")]) is None  # to be safe
    assert bulk_parameters("item", [(1, b"\x00 a blob may hold anything")]) is not None


async def test_a_place_log_is_one_row_per_tick_read_back_from_its_window(tmp_path: Path) -> None:
    said = [Speech(id=f"r:a:{t}:1", tick=t, speaker="a", to="b", text=f"line {t}", location="sq") for t in range(6)]
    bell = Notice(id="r:gm:3:0", tick=3, text="The bell rings.")
    async with open_store(tmp_path / "p.db") as store:
        for t in range(6):
            events = [said[t], bell] if t == 3 else [said[t]]
            await store.add_place_events("sq", t, events, since=2 if t >= 4 else 0 if t == 0 else None)
        await store.add_place_events("lane", 5, [said[5]], since=5)
        await store.end_tick(5)
    async with open_store(tmp_path / "p.db") as store:
        log = await store.place_log()
        assert log == {"sq": [(2, (said[2],)), (3, (said[3], bell)), (4, (said[4],)), (5, (said[5],))],
                       "lane": [(5, (said[5],))]}
        assert store.migrated_at is None
    with sqlite3.connect(tmp_path / "p.db") as conn:
        assert conn.execute("SELECT count(*) FROM place_events").fetchone() == (7,)
        assert conn.execute("SELECT count(*) FROM items").fetchone() == (7,)  # the lane's line is the sq's


def test_the_first_fact_guard_is_the_one_the_golden_of_the_first_guard_needs() -> None:
    prices = Fact(id="f-prices", text="Every snack costs money; nothing is ever free.")
    restated = "As everyone here knows, Every snack costs money; nothing is ever free."  # the snack machine, tick 23
    denied = "Everything is free today!"
    assert first_fact_guard.contradicted_fact(restated, [prices]) == prices
    assert first_fact_guard.contradicted_fact(denied, [prices]) is None
    assert contradicted_fact(restated, [prices]) is None  # the built-in guard, both ways right
    assert contradicted_fact(denied, [prices]) == prices


@pytest.mark.mosquitto
@pytest.mark.timeout(300)
async def test_a_schema_3_store_migrates_resumes_and_continues_to_the_golden_audit(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    db = tmp_path / "village.db"
    shutil.copy(SCHEMA_3, db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (3,)
    written_before = {line.split("\t")[0] for line in audit_lines([db])}  # by renderer 2
    village = str(REPO / "scenarios" / "village.toml")
    stats = await run(RunConfig(
        scenario=village, run_id="golden", until_tick=120, broker=BrokerConfig(url=mosquitto.url),
        inference=InferenceConfig(fact_guard="tests.first_fact_guard:contradicted_fact"),
        record=RecordConfig(db=str(db), resume=True),
    ))
    assert (stats.first_tick, stats.tick) == (61, 119)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("SELECT value FROM meta WHERE key = 'migrated_at'").fetchone() == (60,)
        assert conn.execute("SELECT count(*) FROM place_events").fetchone()[0] > 0
    if REGENERATE:  # the stored records' lines stay as the golden has them (renderer 3's encoding)
        kept = {line.split("\t")[0]: line for line in GOLDEN_FIRST_GUARD.read_text(encoding="utf-8").splitlines()}
        lines = [kept[line.split("\t")[0]] if line.split("\t")[0] in written_before else line
                 for line in audit_lines([db])]
        GOLDEN_FIRST_GUARD.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = [line.split("\t") for line in GOLDEN_FIRST_GUARD.read_text(encoding="utf-8").splitlines()]
    got = [line.split("\t") for line in audit_lines([db])]
    assert [g[0] for g in got] == [e[0] for e in expected]
    assert 0 < len(written_before) < len(expected)
    encoding = AUDIT_COLUMNS.index("encoding")
    for line, want in zip(got, expected, strict=True):
        if line[0] in written_before:  # renderer 2's encoding, the same prompt, state, attempts and line
            assert line[encoding] != want[encoding]
            assert line[:encoding] + line[encoding + 1 :] == want[:encoding] + want[encoding + 1 :], line[0]
        else:
            assert line == want, line[0]
    with open_reader(db) as reader:
        assert reader.last_tick() == 119


async def test_a_schema_3_store_of_several_shards_is_refused_with_a_reason(tmp_path: Path) -> None:
    db = tmp_path / "village.db"
    shutil.copy(SCHEMA_3, db)
    village = str(REPO / "scenarios" / "village.toml")
    config = RunConfig(
        scenario=village, run_id="golden", until_tick=70, shard="0/2", broker=BrokerConfig(url="auto"),
        record=RecordConfig(db=str(db), resume=True),
    )
    with pytest.raises(ConfigError, match="written before schema 4, when shards held NPCs by id"):
        await run(config)
    with open_reader(db) as reader:  # refused before it was claimed: it still resumes on one shard
        assert reader.run_identity() is None
