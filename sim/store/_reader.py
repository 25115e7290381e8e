"""A read-only view of a store file for the CLI: it never modifies the file.

The file is opened with the URI `mode=ro`. When no `-wal` file exists (the store was
closed cleanly, so every committed page is in the main file) it is also opened
`immutable=1`, so SQLite does not create `-wal`/`-shm` files next to it either. With a
`-wal` present (a live or killed writer) the reader uses it, which is how it sees every
committed tick.

A record is packed (`sim.store.records`) and rebuilt from the items it references, which
the reader caches, since neighbouring records share most of them.
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import msgspec

from sim.audit import AuditRecord
from sim.errors import SchemaError, StoreError
from sim.protocol.seal import RunKey
from sim.store._identity import RunIdentity, decode_identity
from sim.store._resume import decode_taken
from sim.store._schema import check_file, check_version
from sim.store._verify import Verification, verify_store
from sim.store.records import COLUMNS, read_packed, unpack_keys, unpack_record
from sim.store.sql import SELECT_ALL_INPUTS
from sim.wire.inputs import Taken

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


_world_decoder = msgspec.json.Decoder(dict[str, str])
_ITEM_CACHE = 1 << 18  # item bodies kept by the reader; past this it forgets them all
_CHUNK = 256  # records decoded per round of item look-ups
_RECORD_COLUMNS = "id, run_id, agent, tick, backend, model, fallback, line, record"


class StoreReader:
    """Queries over an open read-only connection; use `open_reader`."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self._path = path
        self._items: dict[int, bytes] = {}

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: query failed: {exc}") from exc

    def last_tick(self) -> int | None:
        rows = self._query("SELECT value FROM meta WHERE key = 'last_tick'")
        return None if not rows else int(rows[0][0])  # type: ignore[call-overload]

    def run_identity(self) -> RunIdentity | None:
        """The run the store belongs to; None until a run's first start writes it."""
        rows = self._query("SELECT identity FROM run WHERE id = 0")
        if not rows:
            return None
        try:
            return decode_identity(str(rows[0][0]))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{self._path}: the run identity it holds is unreadable: {exc}") from exc

    def scenario_data(self) -> bytes | None:
        """The scenario's bytes as the run read them; None until a run's first start writes them."""
        rows = self._query("SELECT data FROM scenario WHERE id = 0")
        return None if not rows else bytes(rows[0][0])  # type: ignore[call-overload]

    def all_inputs(self) -> list[tuple[int, Taken]]:
        """Every outside input with the tick that took it, in (tick, seq) order."""
        rows = self._query(SELECT_ALL_INPUTS)
        try:
            return [(int(t), decode_taken(str(x))) for t, _, x, _, _ in rows]  # type: ignore[call-overload]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{self._path}: an outside input it holds is unreadable: {exc}") from exc

    def world_changes(self) -> dict[int, dict[str, str]]:
        """Each world-state change by the tick it took effect at."""
        rows = self._query("SELECT tick, state FROM world_changes ORDER BY tick")
        try:
            return {int(t): _world_decoder.decode(str(state)) for t, state in rows}  # type: ignore[call-overload]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{self._path}: a world-state change it holds is unreadable: {exc}") from exc

    def final_state(self) -> dict[str, dict[str, list[tuple[object, ...]]]]:
        """What the store holds of each NPC, and of each place ("place:" + its name), by
        category, each a sorted list of rows: the ground a re-execution is compared on.
        Episodes heard and places' events are (tick, item key) rows, the key a content
        digest, so equal contents compare equal in any two stores."""
        state: dict[str, dict[str, list[tuple[object, ...]]]] = {}
        queries = {
            "system_prompt": "SELECT agent, system_prompt FROM agents",
            "canonical_facts": "SELECT agent, id, text FROM facts WHERE withdrawn = 0",
            "world_state": "SELECT agent, key, value FROM world",
            "beliefs": "SELECT agent, tick, id, text, confidence FROM beliefs",
            "dialogue": "SELECT agent, tick, seq, speaker, text, event FROM dialogue",
            "heard": "SELECT a.agent, h.tick, h.items FROM heard AS h JOIN agent_keys AS a ON a.n = h.agent",
            "place_events": "SELECT 'place:' || place, tick, items FROM place_events",
        }
        for category, sql in queries.items():
            for row in self._query(sql):
                rows = state.setdefault(str(row[0]), {}).setdefault(category, [])
                if category in ("heard", "place_events"):  # one row per item: however the writer batched them
                    rows.extend((row[1], key) for key in unpack_keys(bytes(row[2])))  # type: ignore[call-overload]
                else:
                    rows.append(tuple(row[1:]))
        for categories in state.values():
            for rows in categories.values():
                rows.sort(key=repr)
        return state

    def verify(self, key: RunKey | None, key_name: str = "the run key") -> Verification:
        """Check the whole store against its seals with `key` (`key_name` says where it came
        from); TamperError names the first tick and record, input or row that does not verify."""
        try:
            return verify_store(self._conn, self._path, key, key_name)
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: reading its seals failed: {exc}") from exc

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
        rows = self._query(f"SELECT {_RECORD_COLUMNS} FROM audit WHERE id = ?", (record_id,))
        if not rows:
            raise StoreError(f"{self._path}: no audit record with id {record_id!r}")
        return self._decode(rows)[0]

    def previous_audit_record(self, record: AuditRecord) -> AuditRecord | None:
        """The same agent's record before `record` in (tick, id) order; None for its first."""
        rows = self._query(
            f"SELECT {_RECORD_COLUMNS} FROM audit WHERE agent = ? AND (tick < ? OR (tick = ? AND id < ?))"
            " ORDER BY tick DESC, id DESC LIMIT 1",
            (record.agent_id, record.tick, record.tick, record.id),
        )
        return self._decode(rows)[0] if rows else None

    def latest_audit_record(self, agent_id: str, tick: int | None = None) -> AuditRecord | None:
        """The agent's last record in (tick, id) order, of tick `tick` or before when given;
        None when it has none."""
        bound, params = ("AND tick <= ?", (agent_id, tick)) if tick is not None else ("", (agent_id,))
        rows = self._query(
            f"SELECT {_RECORD_COLUMNS} FROM audit WHERE agent = ? {bound} ORDER BY tick DESC, id DESC LIMIT 1", params
        )
        return self._decode(rows)[0] if rows else None

    def has_agent(self, agent_id: str) -> bool:
        """Whether the run had an NPC of this id."""
        return bool(self._query("SELECT 1 FROM agents WHERE agent = ?", (agent_id,)))

    def audit_records(
        self, agent_id: str | None = None, *, from_tick: int | None = None, to_tick: int | None = None
    ) -> Iterator[AuditRecord]:
        """Every record (of `agent_id`, with from_tick <= tick <= to_tick), ordered by (tick, agent, id).

        Records are decoded a chunk at a time, so memory stays bounded on any store.
        """
        conditions: list[str] = []
        params: list[object] = []
        for condition, value in (("agent = ?", agent_id), ("tick >= ?", from_tick), ("tick <= ?", to_tick)):
            if value is not None:
                conditions.append(condition)
                params.append(value)
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        self._preload_items()
        try:
            cursor = self._conn.execute(
                f"SELECT {_RECORD_COLUMNS} FROM audit {where} ORDER BY tick, agent, id", params
            )
            while rows := cursor.fetchmany(_CHUNK):
                yield from self._decode(rows)
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: reading audit records failed: {exc}") from exc

    def _decode(self, rows: Sequence[Sequence[object]]) -> list[AuditRecord]:
        """Decode rows of `_RECORD_COLUMNS`, fetching the items they reference."""
        wheres = [f"{self._path}: audit record {row[0]!r}" for row in rows]
        packed = [read_packed(row[8], where=where) for row, where in zip(rows, wheres, strict=True)]  # type: ignore[arg-type]
        self._fetch_items(set(itertools.chain.from_iterable(p.keys for p in packed)))
        records = []
        for row, where, stored in zip(rows, wheres, packed, strict=True):
            columns = dict(zip(COLUMNS, row[:8], strict=True))
            columns["fallback"] = bool(columns["fallback"])
            records.append(unpack_record(stored, columns, self._items, where=where))
        return records

    def _preload_items(self) -> None:
        """Read every item in one sequential scan when they fit the cache: far cheaper, for
        a pass over many records, than looking them up a chunk at a time."""
        if self._items:
            return
        (count,) = self._query("SELECT count(*) FROM items")[0]
        if int(count) <= _ITEM_CACHE:  # type: ignore[call-overload]
            self._items.update((int(k), bytes(body)) for k, body in self._query("SELECT k, body FROM items"))  # type: ignore[call-overload]

    def _fetch_items(self, keys: set[int]) -> None:
        missing = sorted(keys.difference(self._items))
        if not missing:
            return
        if len(self._items) + len(missing) > _ITEM_CACHE:
            self._items.clear()
            missing = sorted(keys)
        for start in range(0, len(missing), 50_000):
            chunk = json.dumps(missing[start : start + 50_000])
            rows = self._query("SELECT k, body FROM items WHERE k IN (SELECT value FROM json_each(?))", (chunk,))
            self._items.update((int(k), bytes(body)) for k, body in rows)  # type: ignore[call-overload]


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
