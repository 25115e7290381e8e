"""The files of a store, opened as their owner meant: never through a link, never someone else's.

A store's directory may be shared (a `/tmp`, a team's run folder): whoever can write there
could plant `RUN.db.lock -> victim` (the lock writes a pid and command line into it) or
`RUN.db.key -> attacker.key` (a run key the planter knows). So every file npcsim keeps
beside a store (the writer lock, the run key, the arrivals journal) is opened with
`O_NOFOLLOW` and checked to be a regular file of this user, and the store itself must be
neither a link nor writable by group or others. Each refusal is one line naming the file.

The run key `--broker auto` keeps beside the store (`RUN.db.key`, sim.shard's trust) seals
the store too (sim.store.seals): `kept_key` reads it for the audit.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from sim.errors import ConfigError, StoreError
from sim.protocol.seal import RunKey, run_key_of

__all__ = ["check_store_file", "kept_key", "kept_key_path", "open_own", "read_kept_key"]


def open_own(path: Path, flags: int, what: str, mode: int = 0o600) -> int:
    """`os.open(path, flags)` without following a link at `path`; the file must be a regular
    file owned by this user. FileNotFoundError passes through (a caller may expect it)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path}: {what} is a symbolic link; refusing to follow it (remove the link)") from None
        raise StoreError(f"{path}: cannot open {what}: {exc.strerror or exc}") from None
    try:
        _check_owned(os.fstat(fd), path, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_store_file(path: Path) -> None:
    """Refuse a store that is a link, is not this user's, or that group or others may write."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the database file: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{path}: the store is a symbolic link; give the real file's path")
    if stat.S_ISDIR(st.st_mode):
        return  # check_file names it
    _check_owned(st, path, "the store")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise StoreError(
            f"{path}: the store is writable by {'others' if mode & 0o002 else 'its group'} (mode {mode:04o}), "
            f"so its black box could be edited; `chmod go-w {path}` and start again"
        )


def _check_owned(st: os.stat_result, path: Path, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path}: {what} is not a regular file")
    if st.st_uid != os.geteuid():
        raise StoreError(f"{path}: {what} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); "
                         "refusing to use it")


def kept_key_path(db: Path) -> Path:
    """Where the run key of the store `db` is kept beside it: `RUN.db.key`."""
    return db.with_name(db.name + ".key")


def kept_key(db: Path) -> RunKey | None:
    """The run key kept beside the store `db`; None when there is none."""
    try:
        return read_kept_key(kept_key_path(db))
    except FileNotFoundError:
        return None


def read_kept_key(path: Path) -> RunKey:
    """The key kept beside a store: this user's regular file (not a link: a planted link would
    hand the run a key its planter knows), readable by nobody else. FileNotFoundError passes through."""
    fd = open_own(path, os.O_RDONLY, "the run key kept with the store")
    with os.fdopen(fd, "rb") as file:
        mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"{path}: the run key kept with the store is readable by others (mode {mode:04o}); "
                f"`chmod 600 {path}` and start again"
            )
        data = file.read()
    return run_key_of(data, f"{path}: the run key kept with the store")
