"""Mailboxes and the bus's memory of seen events: sans-I/O, no broker needed.

A `Mailbox` holds an agent's inbox mail, or a place's events until they go into its log
(its intake): either way, bounded. `Deliveries` holds a shard's mailboxes and intakes,
and puts each event in once.

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
from collections.abc import Iterable
from typing import Protocol

from sim.wire.events import AnyEvent, Speech

__all__ = ["Deliveries", "DeliveryCounts", "Mailbox", "Overflow", "SeenEvents", "event_source"]


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


class DeliveryCounts(Protocol):
    """Where `Deliveries` counts what it put in and what it dropped (the bus's statistics)."""

    duplicates: int
    events_delivered: int  # events times the NPCs that hear them
    overflow: Overflow


class Deliveries:
    """A shard's routed events waiting to be taken: each agent's mailbox, made when its first
    mail arrives (idle NPCs have none), and each place's intake until the shard appends it
    to the place's log (one copy per place, whoever listens there). Every event is put in
    once (`SeenEvents`)."""

    def __init__(self, mailbox_size: int, seen_events: int, counts: DeliveryCounts) -> None:
        self._size = mailbox_size
        self._counts = counts
        self._mailboxes: dict[str, Mailbox] = {}
        self._intakes: dict[str, Mailbox] = {}  # place -> its events not yet in its log
        self._listeners: dict[str, int] = {}  # place -> NPCs there
        self._seen = SeenEvents(seen_events)

    def listen(self, place: str, listeners: int) -> None:
        """`listeners` NPCs hear what is said at `place`."""
        self._listeners[place] = listeners

    def mailbox(self, agent: str) -> Mailbox:
        """The agent's mailbox, created when its first mail arrives."""
        box = self._mailboxes.get(agent)
        if box is None:
            box = self._mailboxes[agent] = Mailbox(agent, self._size, self._counts.overflow)
        return box

    def to_place(self, place: str, events: Iterable[AnyEvent]) -> None:
        box = self._intakes.get(place)
        if box is None:
            box = self._intakes[place] = Mailbox(place, self._size, self._counts.overflow)
        self._put(box, self._listeners[place], events)

    def to_inbox(self, agent: str, events: Iterable[AnyEvent]) -> None:
        self._put(self.mailbox(agent), 1, events)

    def _put(self, box: Mailbox, heard_by: int, events: Iterable[AnyEvent]) -> None:
        counts = self._counts
        for event in events:
            if not self._seen.first_time(event):
                counts.duplicates += 1
                continue
            box.put(event)
            counts.events_delivered += heard_by

    def mail_holders(self, before: int) -> list[str]:
        """The agents with mail of a tick earlier than `before`, in id order."""
        return sorted(agent for agent, box in self._mailboxes.items() if box.has_mail(before))

    def take_mail(self, agent: str, before: int) -> list[AnyEvent]:
        """The agent's mail of ticks earlier than `before`, sorted by (tick, id) (`Mailbox.drain`);
        an emptied mailbox is dropped."""
        box = self._mailboxes.get(agent)
        if box is None:
            return []
        mail = box.drain(before)
        if not len(box):
            del self._mailboxes[agent]
        return mail

    def restore_mail(self, mail: Iterable[tuple[str, AnyEvent]]) -> None:
        """Put (agent, event) mail back in the mailboxes: what a resumed shard's last commit left."""
        for agent, event in mail:
            self._seen.first_time(event)
            self.mailbox(agent).put(event)

    def waiting_mail(self, up_to: int) -> list[tuple[str, AnyEvent]]:
        """Every (agent, event) waiting in a mailbox, of ticks up to `up_to`, by agent then
        (tick, id): what a resumed shard must find in its mailboxes again."""
        return [(agent, event) for agent in sorted(self._mailboxes)
                for event in sorted(self._mailboxes[agent].peek(up_to + 1), key=lambda e: (e.tick, e.id))]

    def take_place_events(self, up_to: int) -> list[tuple[str, list[AnyEvent]]]:
        """Each place's events of ticks up to `up_to` (sorted by (tick, id)), places sorted;
        later ones stay (a shard already working on the next tick sent them)."""
        taken = []
        for place in sorted(self._intakes):
            intake = self._intakes[place]
            events = intake.drain(up_to + 1)
            if not len(intake):
                del self._intakes[place]
            if events:
                taken.append((place, events))
        return taken
