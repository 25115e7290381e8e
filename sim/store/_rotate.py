"""Rotating the audit: deleting records that were exported, from a store file.

The only write the audit CLI makes, and only after an export completed: the records are
deleted by the ids that were written out, never by a range alone, so a record a live
writer adds meanwhile is never lost. Items stay: the remaining records and the memories
reference them, so a rotated store still replays.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from sim.errors import SchemaError, StoreError
from sim.store._schema import check_file, check_version

__all__ = ["delete_audit_records"]

_CHUNK = 50_000
_BUSY_TIMEOUT_S = 30.0  # a live writer commits at least once per tick


def delete_audit_records(path: str | os.PathLike[str], ids: Sequence[str]) -> int:
    """Delete the audit records with these ids in one transaction; how many were deleted."""
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
        deleted = 0
        for start in range(0, len(ids), _CHUNK):
            chunk = json.dumps(list(ids[start : start + _CHUNK]))
            deleted += conn.execute("DELETE FROM audit WHERE id IN (SELECT value FROM json_each(?))", (chunk,)).rowcount
        conn.execute("COMMIT")
        return deleted
    except sqlite3.Error as exc:
        raise StoreError(f"{p}: deleting exported audit records failed: {exc}") from exc
    finally:
        conn.close()
