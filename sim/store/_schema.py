"""The store's schema, and the file check done before opening.

`PRAGMA user_version` holds the schema version. A store has exactly one schema: a new file
gets `SCHEMA` in one transaction, and a file of any other version (an earlier npcsim's, a
newer one's) is refused, as is a file that is not SQLite at all. All of these are detected
from the 100-byte header, read as plain bytes, so a refused file is never opened by SQLite
and no -wal/-shm file appears next to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from sim.errors import SchemaError, StoreError

__all__ = ["SCHEMA", "SCHEMA_VERSION", "check_file"]

SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER_SIZE = 100
_USER_VERSION_OFFSET = 60

SCHEMA_VERSION = 9
# The tables and what they hold: docs/store.md. Items and packed records: sim/store/records.py;
# `mac`, `digest`, `link`, `chain` and `rotated`: sim/store/seals.py.
SCHEMA: tuple[str, ...] = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value, mac INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE run (id INTEGER PRIMARY KEY CHECK (id = 0), identity TEXT NOT NULL, mac INTEGER NOT NULL)",
    "CREATE TABLE scenario (id INTEGER PRIMARY KEY CHECK (id = 0), sha256 TEXT NOT NULL, data BLOB NOT NULL,"
    " mac INTEGER NOT NULL)",
    "CREATE TABLE agents (agent TEXT PRIMARY KEY, system_prompt TEXT NOT NULL, mac INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE agent_keys (n INTEGER PRIMARY KEY, agent TEXT NOT NULL UNIQUE, mac INTEGER NOT NULL)",
    "CREATE TABLE facts (agent TEXT NOT NULL, id TEXT NOT NULL, text TEXT NOT NULL, writer TEXT NOT NULL,"
    " withdrawn INTEGER NOT NULL DEFAULT 0, mac INTEGER NOT NULL,"
    " PRIMARY KEY (agent, id)) WITHOUT ROWID",
    "CREATE TABLE world (agent TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, writer TEXT NOT NULL,"
    " mac INTEGER NOT NULL, PRIMARY KEY (agent, key)) WITHOUT ROWID",
    "CREATE TABLE items (k INTEGER PRIMARY KEY, body BLOB NOT NULL)",
    "CREATE TRIGGER items_collision BEFORE INSERT ON items"
    " WHEN EXISTS (SELECT 1 FROM items WHERE k = NEW.k AND body <> NEW.body)"
    " BEGIN SELECT RAISE(ABORT, 'two different items with the same digest key'); END",
    "CREATE TABLE heard (agent INTEGER NOT NULL, tick INTEGER NOT NULL, items BLOB NOT NULL, mac INTEGER NOT NULL)",
    "CREATE INDEX heard_recent ON heard (agent, tick)",
    "CREATE TABLE place_events (place TEXT NOT NULL, tick INTEGER NOT NULL, items BLOB NOT NULL,"
    " mac INTEGER NOT NULL)",
    "CREATE INDEX place_events_recent ON place_events (place, tick)",
    "CREATE TABLE place_windows (place TEXT PRIMARY KEY, since INTEGER NOT NULL, mac INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE kept (agent TEXT NOT NULL, slot INTEGER NOT NULL, body BLOB NOT NULL, mac INTEGER NOT NULL,"
    " PRIMARY KEY (agent, slot)) WITHOUT ROWID",
    "CREATE TABLE summaries (place TEXT NOT NULL, slot INTEGER NOT NULL, events TEXT NOT NULL, body BLOB NOT NULL,"
    " mac INTEGER NOT NULL, PRIMARY KEY (place, slot)) WITHOUT ROWID",
    "CREATE TABLE beliefs (n INTEGER PRIMARY KEY, agent TEXT NOT NULL, id TEXT NOT NULL,"
    " tick INTEGER NOT NULL, text TEXT NOT NULL, confidence REAL NOT NULL, mac INTEGER NOT NULL)",
    "CREATE INDEX beliefs_recent ON beliefs (agent, tick, id)",
    "CREATE TABLE dialogue (n INTEGER PRIMARY KEY, agent TEXT NOT NULL, tick INTEGER NOT NULL,"
    " seq INTEGER NOT NULL, speaker TEXT NOT NULL, text TEXT NOT NULL, event TEXT NOT NULL, mac INTEGER NOT NULL)",
    "CREATE INDEX dialogue_recent ON dialogue (agent, tick, seq)",
    "CREATE TABLE audit (id TEXT PRIMARY KEY, run_id TEXT NOT NULL, agent TEXT NOT NULL,"
    " tick INTEGER NOT NULL, backend TEXT NOT NULL, model TEXT NOT NULL, fallback INTEGER NOT NULL,"
    " line TEXT NOT NULL, record BLOB NOT NULL, link INTEGER NOT NULL, digest INTEGER NOT NULL)",
    "CREATE INDEX audit_agent ON audit (agent, tick)",
    "CREATE INDEX audit_tick ON audit (tick)",
    "CREATE INDEX audit_link ON audit (link)",
    "CREATE TABLE inputs (tick INTEGER NOT NULL, seq INTEGER NOT NULL, input TEXT NOT NULL, link INTEGER NOT NULL,"
    " mac INTEGER NOT NULL, PRIMARY KEY (tick, seq)) WITHOUT ROWID",
    "CREATE TABLE world_changes (tick INTEGER PRIMARY KEY, state TEXT NOT NULL, link INTEGER NOT NULL,"
    " mac INTEGER NOT NULL)",
    "CREATE TABLE chain (n INTEGER PRIMARY KEY, tick INTEGER, records INTEGER NOT NULL, inputs INTEGER NOT NULL,"
    " worlds INTEGER NOT NULL, digest BLOB NOT NULL, head BLOB NOT NULL, seal BLOB NOT NULL)",
    "CREATE TABLE rotated (id TEXT PRIMARY KEY, link INTEGER NOT NULL, digest INTEGER NOT NULL,"
    " mac INTEGER NOT NULL) WITHOUT ROWID",
)


def check_file(path: str | os.PathLike[str], *, must_exist: bool = False) -> None:
    """Refuse a file that is not SQLite, or holds a store of another schema version, unopened.

    A missing or empty file passes (unless `must_exist`): it becomes a new store. The
    header's version is stale while a non-empty `-wal` file holds commits not yet
    checkpointed (a killed writer), so then only the magic is checked here and the
    caller checks `PRAGMA user_version` once it has opened the file.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            header = f.read(_HEADER_SIZE)
    except FileNotFoundError as exc:
        if must_exist:
            raise StoreError(f"{p}: no such database file") from exc
        return
    except IsADirectoryError as exc:
        raise SchemaError(f"{p}: is a directory, not a database") from exc
    except OSError as exc:
        raise StoreError(f"{p}: cannot read the database file: {exc}") from exc
    if not header:
        if must_exist:
            raise SchemaError(f"{p}: the file is empty, not an npcsim store")
        return
    if len(header) < _HEADER_SIZE or not header.startswith(SQLITE_MAGIC):
        raise SchemaError(f"{p}: not an SQLite database (bad header); refusing to open it, the file is left untouched")
    wal = Path(f"{p}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return
    check_version(p, int.from_bytes(header[_USER_VERSION_OFFSET : _USER_VERSION_OFFSET + 4], "big", signed=True))


def check_version(path: Path, version: int) -> None:
    """Refuse a store of another schema version; 0 is a file that holds no store yet."""
    if version == SCHEMA_VERSION or version == 0:
        return
    if 0 < version < SCHEMA_VERSION:
        raise SchemaError(
            f"{path}: store schema {version} was written by an earlier npcsim; this one reads schema "
            f"{SCHEMA_VERSION} only: start a new store (--db NEW.db)"
        )
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{path}: schema version {version} is newer than this npcsim supports ({SCHEMA_VERSION}); "
            "upgrade npcsim. The file is left untouched"
        )
    raise SchemaError(f"{path}: schema version {version} is not an npcsim schema; the file is left untouched")
