"""One writer per store: an exclusive lock on a file next to the database, held while it is open.

Two writers on one file interleave their ticks: a second `npcsim run --db tw.db --resume`
beside a running one left 34 of 46 audit records and two lines in 12 dialogue slots, and
the audit still replayed. So `open_store` takes `hold_writer_lock(path)` first: `flock`
(LOCK_EX | LOCK_NB) on `tw.db.lock`, which holds the holder's pid and command line
(broker passwords redacted). A
second writer is refused at once with one line naming them. The kernel releases the lock
when its process ends, however it ends, so `kill -9` never leaves a store locked; a lock
file left behind is harmless and taken over by the next writer.

Not SQLite's own locking: holding a write lock for the process's life needs
`locking_mode=EXCLUSIVE`, which in WAL mode keeps other processes out entirely, readers
included, while readers (`open_reader`: audit, view, replay) must go on reading a live
store. Not `flock` on the database itself either: SQLite locks it with POSIX locks, which
an NFS client emulates `flock` with, so the two would collide there.

The writer removes the file when it closes. A process that opened the file just before
could then lock the removed file; so after locking, the lock is checked to be the file
at the path still, and taken again otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from sim.errors import StoreError
from sim.mqtt import redact
from sim.store.files import open_own

__all__ = ["hold_writer_lock", "lock_path"]

_ATTEMPTS = 16
_SHOWN = 160  # characters of the holder's command line shown from each end


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + ".lock")


@contextlib.contextmanager
def hold_writer_lock(database: Path) -> Iterator[Path]:
    """Hold the store's writer lock for the block; StoreError naming the holder when another has it."""
    path = lock_path(database)
    fd = _acquire(path, database)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n{_command_line()}\n".encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)  # releases the lock


def _acquire(path: Path, database: Path) -> int:
    for _ in range(_ATTEMPTS):
        fd = open_own(path, os.O_RDWR | os.O_CREAT, "the writer lock", 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise StoreError(f"{database}: cannot lock {path}: {exc.strerror or exc}") from exc
            raise StoreError(
                f"{database} is in use by another writer ({_holder(path)}): one process writes a store at a time; "
                "stop it first, or read the store with `npcsim audit` or `npcsim view`"
            ) from None
        if _still_there(fd, path):
            return fd
        os.close(fd)  # the holder removed the file as we opened it: lock the new one
    raise StoreError(f"{database}: the writer lock {path} keeps changing; is another process racing for it?")


def _still_there(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _holder(path: Path) -> str:
    """"pid N: command line" from the lock file, as far as it says."""
    try:
        pid, _, command = path.read_text(errors="replace").partition("\n")
    except OSError:
        return "pid unknown"
    pid, command = pid.strip(), " ".join(command.split())
    if not pid.isdigit():
        return "pid unknown"
    if len(command) > 2 * _SHOWN:
        command = f"{command[:_SHOWN]} ... {command[-_SHOWN:]}"
    return f"pid {pid}: {command}" if command else f"pid {pid}"


def _command_line() -> str:
    """This process's command line, as `ps` would show it (one line), without broker passwords."""
    try:
        words = Path("/proc/self/cmdline").read_bytes().split(b"\0")
        text = " ".join(w.decode(errors="replace") for w in words if w)
    except OSError:
        text = " ".join(sys.argv)
    return redact(" ".join(text.split()))
