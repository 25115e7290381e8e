"""Attaching to a run on this machine: the run file a run on its own private broker leaves.

A run whose broker npcsim started (`--broker auto`) listens on a random loopback port with
generated logins, so nobody could find it from outside. While it runs it keeps a small
file in the user's run directory (`$XDG_RUNTIME_DIR/npcsim/`, or else `npcsim-{uid}/` in
the temp directory: a directory of mode 0700 owned by the user) with the run id, the
broker's URL and the read-only viewer login, mode 0600. `npcsim subscribe --run ID` and
`npcsim view --run ID` without `--broker` read it. The file goes when the run ends (the
directory too, when it is empty); one left by a killed run names a process that no longer
exists and is ignored (and removed).

    with published(RunFile(run="village-7", shard="0", url=..., username="viewer", password=...)):
        ...                                  # the run
    find_run("village-7")                    # another process: the RunFile, or None

A directory that another user owns or can read is never used: it could hand out a login,
or collect one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psutil

from sim.mqtt import BrokerAddress

__all__ = ["RunFile", "find_run", "local_runs", "published", "runs_dir"]

log = logging.getLogger(__name__)


class RunFile(msgspec.Struct, frozen=True, kw_only=True):
    """A run on this machine and how to attach to it; `url` never holds the password."""

    run: str
    shard: str
    url: str
    username: str | None = None
    password: str | None = None
    pid: int = 0
    started: float = 0.0  # the process's start time: a reused pid is not this run

    def address(self) -> BrokerAddress:
        """The broker with the read-only login (the environment's login is not used)."""
        return BrokerAddress.parse(self.url, env={}).with_login(self.username, self.password)


_decode = msgspec.json.Decoder(RunFile)


def runs_dir() -> Path:
    """Where run files live: `$XDG_RUNTIME_DIR/npcsim`, else `npcsim-{uid}` in the temp directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "npcsim"
    return Path(tempfile.gettempdir()) / f"npcsim-{os.getuid()}"


def _private(directory: Path, *, create: bool) -> bool:
    """`directory` exists (made when `create`), is ours, and nobody else may enter it."""
    if create:
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
    try:
        info = directory.lstat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        log.warning("%s is not a private directory of this user: run files are not kept there", directory)
        return False
    return True


def _start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


@contextlib.contextmanager
def published(entry: RunFile, directory: Path | None = None) -> Iterator[Path | None]:
    """Keep `entry` (for this process) in the run directory for the block; yields its path, or
    None when there is no private directory to keep it in."""
    directory = directory or runs_dir()
    if not _private(directory, create=True):
        yield None
        return
    pid = os.getpid()
    entry = msgspec.structs.replace(entry, pid=pid, started=_start_time(pid) or 0.0)
    path = directory / f"{pid}-{secrets.token_hex(4)}.json"
    partial = path.with_suffix(".part")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileNotFoundError:  # another run's end removed the empty directory just now
        if not _private(directory, create=True):
            yield None
            return
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.encode(entry))
    os.replace(partial, path)  # readers never see half a file
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the last run leaves nothing behind; another's files keep it
            directory.rmdir()


def _read(path: Path) -> RunFile | None:
    try:
        return _decode.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def _alive(entry: RunFile) -> bool:
    started = _start_time(entry.pid)
    return started is not None and abs(started - entry.started) < 1.0


def local_runs(directory: Path | None = None) -> list[RunFile]:
    """The runs on private brokers of this machine that are still going, newest first.

    A file left by a process that is gone is removed.
    """
    directory = directory or runs_dir()
    if not _private(directory, create=False):
        return []
    found = []
    for path in directory.glob("*.json"):
        entry = _read(path)
        if entry is None:
            continue
        if _alive(entry):
            found.append(entry)
        else:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda e: e.started, reverse=True)


def find_run(run: str, directory: Path | None = None) -> RunFile | None:
    """The newest live run `run` on a private broker of this machine, or None."""
    return next((entry for entry in local_runs(directory) if entry.run == run), None)
