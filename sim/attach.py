"""Attaching to a run on this machine: the run file a run on its own private broker leaves.

A run whose broker npcsim started (`--broker auto`) listens on a random loopback port with
generated logins, so nobody could find it from outside. While it runs it keeps a small
file in the user's run directory (`$XDG_RUNTIME_DIR/npcsim/`, or else `npcsim-{uid}/` in
the temp directory: a directory of mode 0700 owned by the user) with the run id, the
broker's URL and the read-only viewer login, mode 0600, and beside it the viewer's password
alone (`password_file`, mode 0600): the run prints that file's path, never the password. The
game system's password (the `game` login: world state, game events and facts, presence) is
kept the same way, in `game_password_file`, and only there.
`npcsim subscribe --run ID` and `npcsim view --run ID` without `--broker` read the run file.
Both files go when the run ends (the directory too, when it is empty); those left by a
killed run name a process that no longer exists and are ignored (and removed).

    with published(RunFile(run="village-7", shard="0", url=..., username="viewer", password=...)):
        ...                                  # the run
    find_runs("village-7")                   # another process: [the RunFile] (or none, or several)

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

__all__ = ["RunFile", "find_runs", "game_password_file", "local_runs", "password_file", "published", "runs_dir"]

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


def password_file(run_file: Path) -> Path:
    """The file beside a run file that holds its viewer's password alone (mode 0600): what
    the run prints instead of the password (`mosquitto_sub -P "$(cat FILE)"`)."""
    return run_file.with_suffix(".password")


def game_password_file(run_file: Path) -> Path:
    """The file beside a run file that holds the game system's password alone (mode 0600)."""
    return run_file.with_suffix(".game-password")


def _remove(run_file: Path) -> None:
    for path in (run_file, password_file(run_file), game_password_file(run_file)):
        path.unlink(missing_ok=True)


def _write_private(path: Path, data: bytes) -> None:
    """`data` in a new file of mode 0600 at `path`; readers never see half a file."""
    partial = path.with_suffix(".part")
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        out.write(data)
    os.replace(partial, path)


@contextlib.contextmanager
def published(entry: RunFile, directory: Path | None = None, *, game_password: str | None = None
              ) -> Iterator[Path | None]:
    """Keep `entry` (for this process) in the run directory for the block, its viewer's
    password also in `password_file(path)` and the game system's in `game_password_file(path)`;
    yields its path, or None when there is no private directory to keep it in."""
    directory = directory or runs_dir()
    if not _private(directory, create=True):
        yield None
        return
    pid = os.getpid()
    entry = msgspec.structs.replace(entry, pid=pid, started=_start_time(pid) or 0.0)
    path = directory / f"{pid}-{secrets.token_hex(4)}.json"
    secret = password_file(path)
    try:
        _write_private(path, msgspec.json.encode(entry))
    except FileNotFoundError:  # another run's end removed the empty directory just now
        if not _private(directory, create=True):
            yield None
            return
        _write_private(path, msgspec.json.encode(entry))
    try:
        if entry.password is not None:
            _write_private(secret, entry.password.encode())
        if game_password is not None:
            _write_private(game_password_file(path), game_password.encode())
        yield path
    finally:
        _remove(path)
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
            _remove(path)
    return sorted(found, key=lambda e: e.started, reverse=True)


def find_runs(run: str, directory: Path | None = None) -> list[RunFile]:
    """The live runs called `run` on private brokers of this machine, newest first: one, none,
    or (two runs started with the same id) several."""
    return [entry for entry in local_runs(directory) if entry.run == run]
