"""Batching, sans-I/O: items and the time in, batches out; no awaits, no clock of its own.

A message per item caps a transport at the broker's per-message cost, so the shells batch:
the bus its traces (one `trace/{shard}` message holds many), the inference transport its
requests and replies. A batch is due when it holds `max_items`, when its items' sizes
reach `max_bytes`, when its oldest item has waited `linger` seconds, or at once when an
item's deadline is nearer than the linger. `take` hands over the next batch whether it is
due or not (what a flush does), ordered by (priority, arrival), within both bounds (an item
over `max_bytes` goes alone); what it leaves is due at once. An item whose deadline passed
is never in a batch: `take` returns it apart, for the caller to answer.

    batcher = Batcher[bytes](max_items=64, max_bytes=256 * 1024, linger=0.05)
    if not batcher.fits(size):             # the waiting items go first, without this one
        send(batcher.take(now)[0])
    batcher.add(item, size=size, now=now)
    if batcher.ready(now):
        send(batcher.take(now)[0])

`now`, the deadlines and the linger are in one clock, the caller's.
"""

from __future__ import annotations

import math
from typing import Generic, TypeVar

__all__ = ["Batcher"]

T = TypeVar("T")


class _Entry(Generic[T]):
    __slots__ = ("deadline", "item", "key", "size")

    def __init__(self, item: T, priority: int, arrival: int, deadline: float, size: int) -> None:
        self.item = item
        self.key = (priority, arrival)
        self.deadline = deadline
        self.size = size


class Batcher(Generic[T]):
    """Collects items into batches by count, size, linger and deadline; the caller gives the time.

    A bound left None is no bound.
    """

    def __init__(self, *, max_items: int | None = None, max_bytes: int | None = None, linger: float = 0.0) -> None:
        if (max_items is not None and max_items < 1) or (max_bytes is not None and max_bytes < 1) or linger < 0:
            raise ValueError(
                f"need max_items >= 1, max_bytes >= 1 and linger >= 0, got {max_items}, {max_bytes} and {linger}"
            )
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.linger = linger
        self._entries: list[_Entry[T]] = []
        self._arrival = 0
        self._bytes = 0
        self._opened = 0.0  # when the oldest waiting item arrived
        self._earliest_deadline = math.inf

    def __len__(self) -> int:
        return len(self._entries)

    def fits(self, size: int) -> bool:
        """Whether an item of `size` would join the waiting items within `max_bytes` (always, when none wait)."""
        return not self._entries or self.max_bytes is None or self._bytes + size <= self.max_bytes

    def add(self, item: T, *, now: float, priority: int = 0, deadline: float = math.inf, size: int = 0) -> None:
        """Queue `item`; `size` counts against `max_bytes`, `priority` orders it (lower first)."""
        if not self._entries:
            self._opened = now
        self._entries.append(_Entry(item, priority, self._arrival, deadline, size))
        self._arrival += 1
        self._bytes += size
        self._earliest_deadline = min(self._earliest_deadline, deadline)

    def _full(self) -> bool:
        return (self.max_items is not None and len(self._entries) >= self.max_items) or (
            self.max_bytes is not None and self._bytes >= self.max_bytes
        )

    def due(self) -> float | None:
        """When the waiting items must go at the latest; None when nothing waits."""
        if not self._entries:
            return None
        if self._full() or self._earliest_deadline <= self._opened + self.linger:
            return self._opened  # full, or an item cannot afford to linger: now
        return self._opened + self.linger

    def ready(self, now: float) -> bool:
        due = self.due()
        return due is not None and now >= due

    def take(self, now: float) -> tuple[list[T], list[T]]:
        """The next batch, due or not (by priority then arrival, within the bounds), and the expired items.

        Expired items (deadline <= now) are never sent: the caller answers them itself.
        What does not fit stays, and is due at once.
        """
        live = [e for e in self._entries if e.deadline > now]
        expired = [e.item for e in self._entries if e.deadline <= now]
        live.sort(key=lambda e: e.key)
        count, size = 0, 0
        for entry in live:
            if count and (
                (self.max_items is not None and count >= self.max_items)
                or (self.max_bytes is not None and size + entry.size > self.max_bytes)
            ):
                break
            count += 1
            size += entry.size
        batch, rest = live[:count], live[count:]
        self._entries = rest
        self._bytes = sum(e.size for e in rest)
        self._opened = now - self.linger if rest else 0.0
        self._earliest_deadline = min((e.deadline for e in rest), default=math.inf)
        return [e.item for e in batch], expired
