"""A place's log in memory: the newest events said there, as few as its listeners can still need.

Every NPC at a place remembers what was said there by referring to the place's log, not by
keeping a copy: its episodic memory is the newest `limit` of its private episodes merged
with the log's events it did not say itself (sim.shard._perception). So the window must
hold, for every listener, at least its newest `limit` events not spoken by it, and then
nothing older can ever reach a working memory again.

The rule, applied after every append: drop the front event while, for every listener
other than its speaker, at least `limit` events not spoken by that listener remain after
it: `len - 1 - count[L] >= limit` for the listener L (other than the front's speaker) with
the most events in the window. The front event is one of L's newest `limit` exactly when
fewer than `limit` of L's "not mine" events follow it; for its own speaker it is no
memory at all. (The coarser rule, with the largest count over everyone, keeps a place
where only one NPC talks forever; speakers who do not listen there, players and the game
system, never hold a window open.) Counts are kept per listener, so a trim costs the
number of listeners who spoke in the window, not the window's length.

Events arrive sorted by (tick, id), a tick at a time; one older than the window's newest
(a late or re-sent event) is put in its place in that order.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable, Collection, Iterable, Iterator

from sim.memory import Episode
from sim.wire.events import AnyEvent, Speech

__all__ = ["Entry", "PlaceWindow"]


class Entry:
    """One event in a window, with who said it (when a listener there), whom it was said to
    (a Speech's `to`), and the memory of it that every listener it was not addressed to
    shares (made on first use, with the function of the listeners' kind that made it)."""

    __slots__ = ("event", "key", "overheard", "speaker", "to")

    def __init__(self, event: AnyEvent, speaker: str | None) -> None:
        self.event = event
        self.key = (event.tick, event.id)
        self.speaker = speaker
        self.to = event.to if isinstance(event, Speech) else None
        self.overheard: tuple[Callable[[AnyEvent, bool], Episode], Episode] | None = None


class PlaceWindow:
    """The window of one place's log; `append` events, then ask what a listener did not say."""

    __slots__ = ("_counts", "_entries", "_listeners", "limit")

    def __init__(self, listeners: Collection[str], limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a window needs a limit >= 1, got {limit}")
        self.limit = limit
        self._listeners = set(listeners)
        self._entries: collections.deque[Entry] = collections.deque()
        self._counts: collections.Counter[str] = collections.Counter()  # listeners' own events in the window

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def listeners(self) -> set[str]:
        """Who hears the place now (an NPC that walks in or out changes it: `add`, `discard`)."""
        return self._listeners

    def add(self, listener: str) -> None:
        self._listeners.add(listener)

    def discard(self, listener: str) -> None:
        """`listener` left: what it said stays attributed to it (its count keeps the window
        longer until those events go, never shorter)."""
        self._listeners.discard(listener)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    @property
    def front_tick(self) -> int | None:
        """The tick of the oldest event kept, or None while the window is empty."""
        return self._entries[0].key[0] if self._entries else None

    def append(self, events: Iterable[AnyEvent]) -> None:
        """Add events (sorted by (tick, id)), then trim the front by the rule."""
        entries = self._entries
        for event in events:
            speaker = event.speaker if isinstance(event, Speech) and event.speaker in self._listeners else None
            entry = Entry(event, speaker)
            if entries and entry.key < entries[-1].key:
                entries.insert(bisect.bisect_right(entries, entry.key, key=lambda e: e.key), entry)
            else:
                entries.append(entry)
            if speaker is not None:
                self._counts[speaker] += 1
        self._trim()

    def not_spoken_by(self, listener: str) -> Iterator[Entry]:
        """The entries not spoken by `listener`, newest first."""
        for entry in reversed(self._entries):
            if entry.speaker != listener:
                yield entry

    def _trim(self) -> None:
        entries, counts, limit = self._entries, self._counts, self.limit
        while len(entries) > limit:
            speaker = entries[0].speaker
            most = max((c for who, c in counts.items() if who != speaker), default=0)
            if len(entries) - 1 - most < limit:
                return
            entries.popleft()
            if speaker is not None:
                counts[speaker] -= 1
                if not counts[speaker]:
                    del counts[speaker]
