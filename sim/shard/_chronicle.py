"""A place's chronicle: its talk folded into summaries, so that its NPCs recall what went on there.

An NPC's hot state holds only its newest memories, and what it overheard is the place's
log (sim.shard._perception), cut to what the hot state can use. Everything said at a place
also waits in its chronicle until `FOLD_EVENTS` events wait; then they are folded into one
summary (`sim.memory.summary_of`: the ticks, who spoke most, the lines that say most),
stored with the ids of the events it folds. A place keeps its newest `MAX_SUMMARIES`, by
slot, the oldest forgotten. What was said to an NPC is kept in its own memory as well
(the store's `keep`), so folding never loses a significant memory.

Deterministic and resumable: a fold depends on the place's events alone, in (tick, id)
order; a summary is committed with its tick, and a resumed shard restores the summaries,
then appends its places' logs from the oldest event not folded (the place's `since`
covers it), which rebuilds exactly the events that waited.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sim.memory import FOLD_EVENTS, MAX_SUMMARIES, Episode, summary_of
from sim.store import Summary
from sim.wire.events import AnyEvent, Speech

__all__ = ["Chronicle"]


class Chronicle:
    """One place's events not yet folded, and its summaries by slot."""

    __slots__ = ("_after", "_next_slot", "_pending", "place", "summaries")

    def __init__(self, place: str) -> None:
        self.place = place
        self.summaries: list[Episode] = []
        self._pending: list[AnyEvent] = []
        self._after = -1  # events of this tick or older are folded already
        self._next_slot = 0

    @property
    def start(self) -> int | None:
        """The tick of the oldest event waiting to be folded."""
        return self._pending[0].tick if self._pending else None

    def restore(self, summaries: Sequence[Summary]) -> None:
        """The place's summaries as the store holds them (slots 0, 1, ... with no gap)."""
        if not summaries:
            return
        newest = max(summaries, key=lambda s: (s.episode.tick, s.slot))
        self.summaries = [s.episode for s in sorted(summaries, key=lambda s: s.slot)]
        self._after = newest.episode.tick
        self._next_slot = (newest.slot + 1) % MAX_SUMMARIES

    def append(self, events: Iterable[AnyEvent]) -> Summary | None:
        """Add a tick's events (sorted); the summary they completed, if they did."""
        pending = self._pending
        for event in events:
            if event.tick > self._after:
                pending.append(event)
        if len(pending) < FOLD_EVENTS:
            return None
        pending.sort(key=lambda e: (e.tick, e.id))
        said = [(e.speaker, e.text) if isinstance(e, Speech) else ("", e.text) for e in pending]
        episode = summary_of(self.place, pending[0].tick, pending[-1].tick, said)
        slot = self._next_slot
        if slot < len(self.summaries):
            self.summaries[slot] = episode
        else:
            self.summaries.append(episode)
        self._next_slot = (slot + 1) % MAX_SUMMARIES
        self._after = pending[-1].tick
        summary = Summary(slot, episode, tuple(e.id for e in pending))
        self._pending = []
        return summary
