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
Records are a 4-byte length, msgpack and a 16-byte MAC of the record before's MAC and this
body (sim.store.seals: keyed with the run key; the first chained to the store's own
`meta.store`), so a record edited, reordered, inserted or taken from another journal is
refused in one line when the journal is opened; a torn last record is dropped, counted,
logged. The MACs start again from the store's with every rewrite.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from pathlib import Path

import msgspec

from sim.errors import StoreError, TamperError
from sim.protocol.outside import Arrival
from sim.store.files import open_own
from sim.store.seals import Sealer

__all__ = ["Arrivals", "arrivals_path", "read_arrivals"]

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
_MAC = 16
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Arrival)


def arrivals_path(database: Path) -> Path:
    """`tw.db` -> `tw.db-arrivals`, beside it as SQLite's own `-wal`."""
    return database.with_name(database.name + "-arrivals")


class Arrivals:
    """The journal of one store; its writer's lock covers it. `open`, `add`, `sync`, `committed`.

    It is read when the store's seals are known (`open`: sim.store.Store.seal_with, or the
    first use), not when the store opens, since its MACs are the run key's.
    """

    def __init__(self, database: Path, last_tick: int | None, store_id: bytes) -> None:
        self.path = arrivals_path(database)
        self._last_tick = last_tick
        self._store_id = store_id
        self._sealer = Sealer()
        self._kept: list[tuple[int, bytes]] = []  # (tick, body) of what is not yet committed
        self._mac = store_id[:_MAC]  # the last record's MAC
        self._fd: int | None = None
        self.pending: list[Arrival] = []
        """What arrived for ticks after `last_tick` and is in no committed tick: a resume takes it."""
        self._lock = threading.Lock()  # `sync` runs in a thread: the descriptor is not swapped under it
        with contextlib.suppress(FileNotFoundError):  # a planted link is refused now, not at the first use
            os.close(open_own(self.path, os.O_RDONLY, "the arrivals journal"))

    @property
    def opened(self) -> bool:
        return self._fd is not None

    def open(self, sealer: Sealer) -> None:
        """Read the journal, refusing one whose MACs do not verify with `sealer`; keep what is
        not committed (`pending`) and rewrite the file with it."""
        self._sealer = sealer
        kept = [(a, body) for a, body in _read(self.path, self._store_id, sealer)
                if self._last_tick is None or a.tick > self._last_tick]
        self._kept = [(a.tick, body) for a, body in kept]
        self.pending = [a for a, _ in kept]
        self._fd = self._rewrite()

    def add(self, arrival: Arrival) -> None:
        """Append one arrival (one write(2): the kernel has it when this returns)."""
        if self._fd is None:
            raise StoreError(f"{self.path}: the arrivals journal is not open")
        body = _encoder.encode(arrival)
        mac = self._sealer.journal(self._mac, body)
        try:
            os.write(self._fd, _LENGTH.pack(len(body)) + body + mac)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot append an outside input: {exc}") from exc
        self._mac = mac
        self._kept.append((arrival.tick, body))

    def sync(self) -> None:
        """Flush what was appended to the disk (fdatasync); safe to call from another thread."""
        if self._kept and self._fd is not None:
            try:
                with self._lock:
                    os.fdatasync(self._fd)
            except OSError as exc:
                raise StoreError(f"{self.path}: cannot flush the outside inputs to disk: {exc}") from exc

    def committed(self, tick: int) -> None:
        """Tick `tick` is on disk: drop the arrivals it (or an earlier tick) took."""
        if self._fd is not None and any(t <= tick for t, _ in self._kept):
            self._kept = [(t, body) for t, body in self._kept if t > tick]
            fd = self._rewrite()
            with self._lock:
                old, self._fd = self._fd, fd
            os.close(old)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)

    def _rewrite(self) -> int:
        """Write the kept records to a new file, their MACs chained from the start again, put
        it in place atomically; its descriptor."""
        mac = self._store_id[:_MAC]
        records = []
        for _, body in self._kept:
            mac = self._sealer.journal(mac, body)
            records.append(_LENGTH.pack(len(body)) + body + mac)
        new = self.path.with_name(self.path.name + ".new")
        try:
            fd = open_own(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, "the arrivals journal", 0o644)
            os.write(fd, b"".join(records))
            os.fdatasync(fd)
            os.replace(new, self.path)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot write the outside inputs: {exc}") from exc
        self._mac = mac
        return fd


def read_arrivals(database: Path, last_tick: int | None) -> list[Arrival]:
    """What the journal of the store `database` holds for ticks after `last_tick`, without
    changing it or checking its MACs (a watcher's or a test's look; the store's writer owns
    the file and checks them)."""
    return [a for a, _ in _read(arrivals_path(database), None, None) if last_tick is None or a.tick > last_tick]


def _read(path: Path, store_id: bytes | None, sealer: Sealer | None) -> list[tuple[Arrival, bytes]]:
    """Every whole record, with its body; with a `sealer`, each one's MAC checked, chained from `store_id`."""
    try:
        fd = open_own(path, os.O_RDONLY, "the arrivals journal")
    except FileNotFoundError:
        return []
    try:
        with os.fdopen(fd, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the outside inputs: {exc}") from exc
    found: list[tuple[Arrival, bytes]] = []
    at = 0
    mac = b"" if store_id is None else store_id[:_MAC]
    while at + _LENGTH.size <= len(data):
        (size,) = _LENGTH.unpack_from(data, at)
        end = at + _LENGTH.size + size + _MAC
        if end > len(data):
            break
        body = data[at + _LENGTH.size : end - _MAC]
        if sealer is not None:
            mac = sealer.journal(mac, body)
            if mac != data[end - _MAC : end]:
                raise TamperError(f"{path}: record {len(found) + 1} (at byte {at}) does not match its seal: the "
                                  "journal was edited, reordered or added to outside npcsim; refusing to take it")
        try:
            found.append((_decoder.decode(body), body))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{path}: the outside input at byte {at} is unreadable: {exc}") from exc
        at = end
    if at < len(data):
        log.warning("%s: a torn last record (%d bytes, cut by a kill during its write) dropped", path, len(data) - at)
    return found
