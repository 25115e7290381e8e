"""Mailboxes and the bus's memory of seen events: sans-I/O, no broker needed.

A `Mailbox` holds an agent's inbox mail, or a place's events until they go into its log
(the router's intakes): either way, bounded.

A full mailbox drops the excess of whoever floods it: the event dropped is the newest one
from the source holding the most events in the box (the arriving event itself when its
source is that one), so one chatty speaker cannot push out everyone else's words. Every
drop is counted per mailbox until `Overflow.take` hands the counts to the tick's report.

De-duplication remembers what an event *is*, not only its id: a redelivered QoS 1 message
decodes to an equal event and is dropped, while another publisher's event that merely
carries the same id cannot suppress the real one.
"""

from __future__ import annotations

import collections

from sim.wire.events import AnyEvent, Speech

__all__ = ["Mailbox", "Overflow", "SeenEvents", "event_source"]


def event_source(event: AnyEvent) -> str:
    """Who caused an event: the speaker, or the game system for a notice."""
    return event.speaker if isinstance(event, Speech) else "(notice)"


class Overflow:
    """Dropped events per mailbox since the last `take`, and in total."""

    def __init__(self) -> None:
        self.total = 0
        self._pending: collections.Counter[str] = collections.Counter()
        self._sources: dict[str, collections.Counter[str]] = {}

    def count(self, mailbox: str, source: str) -> None:
        self.total += 1
        self._pending[mailbox] += 1
        self._sources.setdefault(mailbox, collections.Counter())[source] += 1

    def take(self) -> dict[str, tuple[int, str]]:
        """Per mailbox: (events dropped, the source most dropped from); then start over."""
        report = {box: (n, self._sources[box].most_common(1)[0][0]) for box, n in sorted(self._pending.items())}
        self._pending.clear()
        self._sources.clear()
        return report


class Mailbox:
    """An agent's bounded mailbox; drained once per tick in a stable order."""

    __slots__ = ("_by_source", "_items", "_overflow", "maxsize", "name")

    def __init__(self, name: str, maxsize: int, overflow: Overflow) -> None:
        self.name = name
        self.maxsize = maxsize
        self._items: collections.deque[AnyEvent] = collections.deque()
        self._by_source: collections.Counter[str] = collections.Counter()
        self._overflow = overflow

    def put(self, event: AnyEvent) -> None:
        source = event_source(event)
        if len(self._items) >= self.maxsize:
            flooder, held = self._by_source.most_common(1)[0]
            if self._by_source[source] + 1 >= held:
                self._overflow.count(self.name, source)
                return
            self._drop_newest(flooder)
        self._items.append(event)
        self._by_source[source] += 1

    def _drop_newest(self, source: str) -> None:
        for i in range(len(self._items) - 1, -1, -1):
            if event_source(self._items[i]) == source:
                del self._items[i]
                self._by_source[source] -= 1
                self._overflow.count(self.name, source)
                return

    def __len__(self) -> int:
        return len(self._items)

    def peek(self, before: int) -> list[AnyEvent]:
        """The waiting events of ticks earlier than `before`, left in the box."""
        return [e for e in self._items if e.tick < before]

    def has_mail(self, before: int) -> bool:
        """Whether an event of a tick earlier than `before` is waiting."""
        return any(e.tick < before for e in self._items)

    def drain(self, before: int | None = None) -> list[AnyEvent]:
        """Every waiting event of a tick earlier than `before` (default: all), sorted by
        (tick, id): the order never depends on arrival. Events of later ticks (from a
        shard already working on the next tick) stay for the tick that perceives them."""
        if before is None:
            taken, kept = list(self._items), []
        else:
            taken = [e for e in self._items if e.tick < before]
            kept = [e for e in self._items if e.tick >= before]
        self._items = collections.deque(kept)
        self._by_source = collections.Counter(event_source(e) for e in kept)
        return sorted(taken, key=lambda e: (e.tick, e.id))


class SeenEvents:
    """A bounded LRU of events already delivered, keyed by id and content together."""

    def __init__(self, size: int) -> None:
        self._keys: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        self._size = size

    def first_time(self, event: AnyEvent) -> bool:
        key = (event.id, hash(event))
        if key in self._keys:
            self._keys.move_to_end(key)
            return False
        self._keys[key] = None
        if len(self._keys) > self._size:
            self._keys.popitem(last=False)
        return True
