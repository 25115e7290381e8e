"""A read-only view of a store file for the CLI: it never modifies the file.

The file is opened with the URI `mode=ro`. When no `-wal` file exists (the store was
closed cleanly, so every committed page is in the main file) it is also opened
`immutable=1`, so SQLite does not create `-wal`/`-shm` files next to it either. With a
`-wal` present (a live or killed writer) the reader uses it, which is how it sees every
committed tick.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from sim.audit import AuditRecord, decode_record
from sim.errors import SchemaError, StoreError
from sim.store._schema import check_file, check_version

__all__ = ["AuditSummary", "StoreReader", "open_reader"]


class AuditSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One line of `npcsim audit list`."""

    id: str
    run_id: str
    agent_id: str
    tick: int
    backend: str
    model: str
    fallback: bool
    line: str


class StoreReader:
    """Queries over an open read-only connection; use `open_reader`."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self._path = path

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: query failed: {exc}") from exc

    def last_tick(self) -> int | None:
        rows = self._query("SELECT value FROM meta WHERE key = 'last_tick'")
        return None if not rows else int(rows[0][0])  # type: ignore[call-overload]

    def integrity_check(self) -> str:
        """SQLite's verdict on the file: "ok" when it is sound."""
        return "\n".join(str(row[0]) for row in self._query("PRAGMA integrity_check"))

    def audit_summaries(self, agent_id: str | None = None) -> list[AuditSummary]:
        """Every record's summary, ordered by (tick, agent, id)."""
        where, params = ("WHERE agent = ?", (agent_id,)) if agent_id is not None else ("", ())
        rows = self._query(
            f"SELECT id, run_id, agent, tick, backend, model, fallback, line FROM audit {where}"
            " ORDER BY tick, agent, id",
            params,
        )
        return [
            AuditSummary(
                id=str(r[0]),
                run_id=str(r[1]),
                agent_id=str(r[2]),
                tick=int(r[3]),  # type: ignore[call-overload]
                backend=str(r[4]),
                model=str(r[5]),
                fallback=bool(r[6]),
                line=str(r[7]),
            )
            for r in rows
        ]

    def audit_record(self, record_id: str) -> AuditRecord:
        rows = self._query("SELECT record FROM audit WHERE id = ?", (record_id,))
        if not rows:
            raise StoreError(f"{self._path}: no audit record with id {record_id!r}")
        return decode_record(rows[0][0], where=f"{self._path}: audit record {record_id!r}")  # type: ignore[arg-type]

    def audit_records(self, agent_id: str | None = None) -> Iterator[AuditRecord]:
        """Every record, decoded one at a time, ordered by (tick, agent, id)."""
        where, params = ("WHERE agent = ?", (agent_id,)) if agent_id is not None else ("", ())
        try:
            cursor = self._conn.execute(f"SELECT id, record FROM audit {where} ORDER BY tick, agent, id", params)
            for record_id, blob in cursor:
                yield decode_record(blob, where=f"{self._path}: audit record {record_id!r}")
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: reading audit records failed: {exc}") from exc


@contextmanager
def open_reader(path: str | os.PathLike[str]) -> Iterator[StoreReader]:
    """Open a store file read-only; refuses what `open_store` refuses, never writes."""
    p = Path(path).resolve()
    check_file(p, must_exist=True)
    uri = f"{p.as_uri()}?mode=ro"
    if not Path(f"{p}-wal").exists():
        uri += "&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"{p}: cannot open the database read-only: {exc}") from exc
    try:
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise SchemaError(f"{p}: cannot read the database: {exc}") from exc
        check_version(p, version)
        if version == 0:
            raise SchemaError(f"{p}: not an npcsim store (schema version 0)")
        yield StoreReader(conn, p)
    finally:
        conn.close()
