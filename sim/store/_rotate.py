"""Rotating the audit: deleting records that were exported, from a store file.

The only write the audit CLI makes, and only after an export completed: the records are
deleted by the ids that were written out, never by a range alone, so a record a live
writer adds meanwhile is never lost. Items stay: the remaining records and the memories
reference them, so a rotated store still replays. Each record deleted leaves its id, the
commit that wrote it and its digest in `rotated`, sealed with the store's run key, so its
link of the chain still verifies (sim.store._chain); a record that does not match its
digest is not deleted (that would hide the edit).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from sim.errors import SchemaError, StoreError, TamperError
from sim.protocol.seal import RunKey
from sim.store._schema import check_file, check_version
from sim.store.seals import AUDIT_DIGEST, Sealer, describe, digest

__all__ = ["delete_audit_records"]

_CHUNK = 50_000
_BUSY_TIMEOUT_S = 30.0  # a live writer commits at least once per tick
_RECORDS = f"SELECT {', '.join(AUDIT_DIGEST[0])}, digest FROM audit WHERE id IN (SELECT value FROM json_each(?))"
_ROTATED = "INSERT INTO rotated (id, link, digest, mac) VALUES (?, ?, ?, ?)"


def delete_audit_records(path: str | os.PathLike[str], ids: Sequence[str], key: RunKey | None = None) -> int:
    """Delete the audit records with these ids in one transaction; how many were deleted.

    `key` is the run key the store was sealed with (None for a store sealed without one):
    what is kept of each record is sealed with it.
    """
    p = Path(path)
    check_file(p, must_exist=True)
    try:
        conn = sqlite3.connect(p, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"{p}: cannot open the database: {exc}") from exc
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        check_version(p, version)
        if version == 0:
            raise SchemaError(f"{p}: not an npcsim store (schema version 0)")
        conn.execute("BEGIN IMMEDIATE")
        sealer = _sealer(conn, p, key)
        deleted = 0
        for start in range(0, len(ids), _CHUNK):
            chunk = json.dumps(list(ids[start : start + _CHUNK]))
            kept = []
            for row in conn.execute(_RECORDS, (chunk,)):
                if digest("audit", row[:-1]) != row[-1]:
                    raise TamperError(f"{p}: {describe('audit', row)} does not match its digest: it was edited "
                                      "outside npcsim; nothing is deleted")
                record_id, link = row[0], row[AUDIT_DIGEST[0].index("link")]
                kept.append((record_id, link, row[-1], sealer.mac("rotated", (record_id, link, row[-1]))))
            conn.executemany(_ROTATED, kept)
            deleted += conn.execute("DELETE FROM audit WHERE id IN (SELECT value FROM json_each(?))", (chunk,)).rowcount
        conn.execute("COMMIT")
        return deleted
    except sqlite3.Error as exc:
        raise StoreError(f"{p}: deleting exported audit records failed: {exc}") from exc
    finally:
        conn.close()


def _sealer(conn: sqlite3.Connection, path: Path, key: RunKey | None) -> Sealer:
    """The seals of the store: its run key's, or none when it was sealed without one."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'seal'").fetchone()
    if row is None or int(row[0]) == Sealer().check:
        return Sealer()
    sealer = Sealer(key)
    if int(row[0]) != sealer.check:
        why = "is not beside it" if key is None else "beside it is another"
        raise StoreError(f"{path}: nothing is deleted: the store is sealed with a run key, which rotating needs to "
                         f"seal what it removes, and {path.name}.key {why}")
    return sealer
