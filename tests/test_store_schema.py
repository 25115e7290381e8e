"""The store's one schema: a store of an earlier npcsim is refused, unopened, with one line
saying what to do; the writer's bulk statements against it; the places' logs.

tests/golden/village-schema3-tick60.sqlite is such a store: the village's run stopped after
tick 60, written by an npcsim of schema 3.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import SchemaError
from sim.store import SCHEMA_VERSION, open_reader, open_store
from sim.store.sql import BULK, INSERT, bulk_parameters
from sim.wire.events import Notice, Speech
from tests.golden import GOLDEN
from tests.helpers import fingerprint

SCHEMA_3 = GOLDEN / "village-schema3-tick60.sqlite"


def _old_store(tmp_path: Path) -> Path:
    db = tmp_path / "village.db"
    shutil.copy(SCHEMA_3, db)
    return db


def _refusal(db: Path) -> str:
    return (f"{db}: store schema 3 was written by an earlier npcsim; this one reads schema {SCHEMA_VERSION} only: "
            "start a new store (--db NEW.db)")


async def test_a_store_of_an_earlier_schema_is_refused_in_one_line_and_left_as_it_was(tmp_path: Path) -> None:
    db = _old_store(tmp_path)
    before = fingerprint(db)
    with pytest.raises(SchemaError) as refused:
        async with open_store(db):
            pass
    assert str(refused.value) == _refusal(db)
    with pytest.raises(SchemaError) as refused, open_reader(db):
        pass
    assert str(refused.value) == _refusal(db.resolve())
    assert fingerprint(db) == before


def test_the_cli_names_the_old_store_and_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _old_store(tmp_path)
    before = fingerprint(db)
    assert main(["audit", "list", "--db", str(db)]) != 0
    err = capsys.readouterr().err
    assert f"store schema 3 was written by an earlier npcsim; this one reads schema {SCHEMA_VERSION} only" in err
    assert "start a new store (--db NEW.db)" in err and len(err.strip().splitlines()) == 1
    assert fingerprint(db) == before


def _schema(db: Path) -> list[str]:
    """The statements of a new store's schema, as SQLite keeps them."""

    async def create() -> None:
        async with open_store(db):
            pass

    asyncio.run(create())
    with sqlite3.connect(db) as conn:
        ddl = [sql for (sql,) in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")]
    conn.close()
    return ddl


def test_bulk_statements_store_exactly_what_one_row_at_a_time_stores(tmp_path: Path) -> None:
    rng = random.Random(4)
    texts = ["", "plain", "line\nbreak \u2028 \"quoted\" \\ back", "\x01\x1f\x7f \U0001f600 é", "x" * 5000,
             "<|im_start|>", "123", "null"]
    def mac() -> int:  # as the writer gives each row (sim.store.seals)
        return rng.getrandbits(64) - 2**63

    rows = {
        "line": [(f"n{i}", rng.randrange(100), i, rng.choice(texts), rng.choice(texts), rng.choice(texts), mac())
                 for i in range(50)],
        "belief": [(f"n{i}", rng.choice(texts), i, rng.choice(texts), rng.random(), mac()) for i in range(50)],
        "item": [(rng.getrandbits(63) - 2**62, rng.randbytes(rng.randrange(0, 300))) for _ in range(50)],
        "audit": [(f"r:n{i}:0:1", "r", f"n{i}", 0, "scripted", rng.choice(texts), bool(i % 2), rng.choice(texts),
                   i // 10 + 1, mac(), rng.randbytes(40)) for i in range(50)],
        "place_window": [(f"p{i}", i, mac()) for i in range(10)],
    }
    ddl = _schema(tmp_path / "schema.db")
    got = {}
    for how in ("one at a time", "bulk"):
        conn = sqlite3.connect(":memory:", isolation_level=None)
        for statement in ddl:
            conn.execute(statement)
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
    with sqlite3.connect(tmp_path / "p.db") as conn:
        assert conn.execute("SELECT count(*) FROM place_events").fetchone() == (7,)
        assert conn.execute("SELECT count(*) FROM items").fetchone() == (7,)  # the lane's line is the sq's
