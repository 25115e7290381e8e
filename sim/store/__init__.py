"""Persistent NPC state in SQLite (aiosqlite), with authority enforced, and the audit log.

`open_store` is the writer side (one process at a time: a second writer is refused);
`open_reader` is a read-only view for the CLI that never modifies the file (and checks it
against its seals: `StoreReader.verify`); `delete_audit_records` rotates exported records
out of a file; `kept_key` is the run key kept beside a store. `RunIdentity` is the run a
store belongs to (`Store.identity`, `StoreReader.run_identity`). `new_store`, `newest_store`
and `prune_stores` keep the stores of runs without a file of their own in one folder.
"""

from sim.errors import AuthorityError, SchemaError, StoreError, TamperError
from sim.store._arrivals import arrivals_path, read_arrivals
from sim.store._authority import Writer
from sim.store._database import HOT_LIMIT, Store, StoreStatistics, open_store
from sim.store._identity import RunIdentity, RunSettings
from sim.store._places import PlaceRows, Summaries, Summary
from sim.store._reader import AuditSummary, StoreReader, open_reader
from sim.store._resume import Pending, Resume, TickRecord
from sim.store._rotate import delete_audit_records
from sim.store._runs import new_store, newest_store, prune_stores
from sim.store._schema import SCHEMA_VERSION
from sim.store._verify import Verification
from sim.store.files import kept_key, kept_key_path, open_own, read_kept_key

__all__ = [
    "HOT_LIMIT",
    "SCHEMA_VERSION",
    "AuditSummary",
    "AuthorityError",
    "Pending",
    "PlaceRows",
    "Resume",
    "RunIdentity",
    "RunSettings",
    "SchemaError",
    "Store",
    "StoreError",
    "StoreReader",
    "StoreStatistics",
    "Summaries",
    "Summary",
    "TamperError",
    "TickRecord",
    "Verification",
    "Writer",
    "arrivals_path",
    "delete_audit_records",
    "kept_key",
    "kept_key_path",
    "new_store",
    "newest_store",
    "open_own",
    "open_reader",
    "open_store",
    "prune_stores",
    "read_arrivals",
    "read_kept_key",
]
