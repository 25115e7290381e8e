"""The folder of kept stores: where a run without a store file of its own keeps its black box.

`npcsim run` without `--db` keeps its store in `./runs` (`record.runs_dir`): `new_store`
names a file no store holds yet (`RUN-ID.db`, then `RUN-ID.2.db`, ... for later runs of the
same id: a run never continues or clobbers another by accident), `newest_store` finds the
one `--resume` continues, and `prune_stores` keeps the folder from growing without end.

Retention keeps the newest `keep` stores (by modification time) and deletes the older
ones with the files beside them. It deletes only what is certainly an npcsim store of this
user (a regular file, not a link, that `open_reader` opens) and never one a writer holds:
it takes the store's writer lock first (sim.store._lock), so a run resuming an old store
is either refused at once or keeps it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from sim.errors import StoreError
from sim.store._lock import hold_writer_lock
from sim.store._reader import open_reader

__all__ = ["new_store", "newest_store", "prune_stores"]

_BESIDE = ("-wal", "-shm", "-journal", "-arrivals", "-arrivals.new", ".key")
"""What npcsim and SQLite keep beside a store `X.db` (as `X.db-wal`, ...), the writer lock
aside (its holder removes it): the repository's .gitignore lists the same."""


def new_store(directory: Path, stem: str) -> Path:
    """A store path in `directory` (made, mode 0700, when missing) that no file holds yet:
    `stem.db`, else `stem.2.db`, `stem.3.db`, ..."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"{directory}: cannot make the folder for the run's store: {exc.strerror or exc}") from None
    path = directory / f"{stem}.db"
    n = 1
    while path.exists() or path.is_symlink():
        n += 1
        path = directory / f"{stem}.{n}.db"
    return path


def newest_store(directory: Path, run_id: str, shard: str) -> Path | None:
    """The most recently written store in `directory` of run `run_id`, shard `shard` ("i/n")."""
    found = []
    for path in _owned_files(directory):
        with contextlib.suppress(StoreError), open_reader(path) as reader:
            identity = reader.run_identity()
            if identity is not None and (identity.run_id, identity.shard) == (run_id, shard):
                found.append(path)
    return max(found, key=_written, default=None)


def prune_stores(directory: Path, keep: int) -> list[Path]:
    """Delete the stores in `directory` beyond the newest `keep`, with the files beside them,
    except those a writer holds; the paths deleted, oldest first."""
    stores = sorted(_stores(directory), key=_written, reverse=True)
    deleted = []
    for path in reversed(stores[keep:]):
        try:
            with hold_writer_lock(path):
                path.unlink()
                for beside in _BESIDE:
                    path.with_name(path.name + beside).unlink(missing_ok=True)
        except (StoreError, OSError):
            continue  # held by a writer (or gone meanwhile): kept
        deleted.append(path)
    return deleted


def _owned_files(directory: Path) -> list[Path]:
    """The `*.db` files in `directory` that are regular files (not links) of this user."""
    try:
        candidates = sorted(directory.glob("*.db"))
    except OSError:
        return []
    found = []
    for path in candidates:
        with contextlib.suppress(OSError):
            info = path.lstat()
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                found.append(path)
    return found


def _stores(directory: Path) -> list[Path]:
    """The npcsim stores of this user in `directory`: the files of `_owned_files` that open as one."""
    found = []
    for path in _owned_files(directory):
        with contextlib.suppress(StoreError), open_reader(path):
            found.append(path)
    return found


def _written(path: Path) -> float:
    """When the store was last written: its file's or its write-ahead log's time, the later."""
    times = []
    for file in (path, path.with_name(path.name + "-wal")):
        with contextlib.suppress(OSError):
            times.append(file.stat().st_mtime)
    return max(times, default=0.0)
