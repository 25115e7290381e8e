"""The arrivals journal: outside input on disk the moment it arrives, before its tick commits.

Player input and world-state changes come from outside clients; the broker delivers each
once (QoS 1) and forgets it. The store writes an input with the tick that takes it, and a
tick is on disk only when it commits, so an input that arrived during a tick cut short by
kill -9 went with that tick. So each one is also appended here, beside the store
(`tw.db-arrivals`), as the bus receives it, stamped with the tick that will take it; a
resumed shard takes every arrival of a tick not committed at that same tick, and arrivals
of committed ticks are dropped from the file as their tick commits (the store has them).

Why a file of its own, not a row: the store's one writer keeps a tick's transaction open
until the tick commits (sim.store._writer), and committing mid-tick would put half a tick
on disk. Why persisted, not held unacknowledged (MQTT manual acknowledgement until the
tick commits): the broker keeps an unacknowledged message for a client only in a
persistent session, and the shard's one connection would then have every place's batches
queued for it while it is down, and the input would come back without the tick it had
been taken at, so a resume could not take it at the same tick.

Each record is appended with one write(2): once it returns the kernel has it, and a
kill -9 of the process loses nothing after that (`sync` flushes the file to the disk, for
a machine that loses power: the shard calls it before the tick that takes an input can
commit). What paho acknowledged but the bus had not read yet (a moment) can still go.
Records are a 4-byte length and msgpack; a torn last record is dropped, counted, logged.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from pathlib import Path

import msgspec

from sim.errors import StoreError
from sim.protocol.outside import Arrival
from sim.store.files import open_own

__all__ = ["Arrivals", "arrivals_path", "read_arrivals"]

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Arrival)


def arrivals_path(database: Path) -> Path:
    """`tw.db` -> `tw.db-arrivals`, beside it as SQLite's own `-wal`."""
    return database.with_name(database.name + "-arrivals")


class Arrivals:
    """The journal of one store; its writer's lock covers it. `add`, `sync`, `committed`."""

    def __init__(self, database: Path, last_tick: int | None) -> None:
        self.path = arrivals_path(database)
        kept = _read(self.path, last_tick)
        self._kept: list[tuple[int, bytes]] = [(a.tick, record) for a, record in kept]  # not yet committed
        self.pending: list[Arrival] = [a for a, _ in kept]
        """What arrived for ticks after `last_tick` and is in no committed tick: a resume takes it."""
        self._fd = self._rewrite()
        self._lock = threading.Lock()  # `sync` runs in a thread: the descriptor is not swapped under it

    def add(self, arrival: Arrival) -> None:
        """Append one arrival (one write(2): the kernel has it when this returns)."""
        body = _encoder.encode(arrival)
        record = _LENGTH.pack(len(body)) + body
        try:
            os.write(self._fd, record)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot append an outside input: {exc}") from exc
        self._kept.append((arrival.tick, record))

    def sync(self) -> None:
        """Flush what was appended to the disk (fdatasync); safe to call from another thread."""
        if self._kept:
            try:
                with self._lock:
                    os.fdatasync(self._fd)
            except OSError as exc:
                raise StoreError(f"{self.path}: cannot flush the outside inputs to disk: {exc}") from exc

    def committed(self, tick: int) -> None:
        """Tick `tick` is on disk: drop the arrivals it (or an earlier tick) took."""
        if any(t <= tick for t, _ in self._kept):
            self._kept = [(t, r) for t, r in self._kept if t > tick]
            fd = self._rewrite()
            with self._lock:
                old, self._fd = self._fd, fd
            os.close(old)

    def close(self) -> None:
        os.close(self._fd)

    def _rewrite(self) -> int:
        """Write the kept records to a new file, put it in place atomically; its descriptor."""
        new = self.path.with_name(self.path.name + ".new")
        try:
            fd = open_own(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, "the arrivals journal", 0o644)
            os.write(fd, b"".join(r for _, r in self._kept))
            os.fdatasync(fd)
            os.replace(new, self.path)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot write the outside inputs: {exc}") from exc
        return fd


def read_arrivals(database: Path, last_tick: int | None) -> list[Arrival]:
    """What the journal of the store `database` holds for ticks after `last_tick`, without
    changing it (a watcher's or a test's look; the store's writer owns the file)."""
    return [a for a, _ in _read(arrivals_path(database), last_tick)]


def _read(path: Path, last_tick: int | None) -> list[tuple[Arrival, bytes]]:
    try:
        fd = open_own(path, os.O_RDONLY, "the arrivals journal")
    except FileNotFoundError:
        return []
    try:
        with os.fdopen(fd, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the outside inputs: {exc}") from exc
    kept: list[tuple[Arrival, bytes]] = []
    at = 0
    while at + _LENGTH.size <= len(data):
        (size,) = _LENGTH.unpack_from(data, at)
        end = at + _LENGTH.size + size
        if end > len(data):
            break
        try:
            arrival = _decoder.decode(data[at + _LENGTH.size : end])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{path}: the outside input at byte {at} is unreadable: {exc}") from exc
        if last_tick is None or arrival.tick > last_tick:
            kept.append((arrival, data[at:end]))
        at = end
    if at < len(data):
        log.warning("%s: a torn last record (%d bytes, cut by a kill during its write) dropped", path, len(data) - at)
    return kept
