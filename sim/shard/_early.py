"""Outside players' input, answered in the tick that takes it.

A line an NPC or a scripted player says in a tick is heard at the next one: the barrier
must first make sure every shard's lines of the tick arrived. An outside player's input
needs no such wait: the shard that holds the addressed NPC takes it (sim.protocol.outside),
at the tick its arrival was journaled with, so the NPC can answer it in that same tick,
the same on any layout, on `--resume` and in a re-execution. `EarlyMail` holds it from the
inputs phase to the NPC's turn: as direct mail (what the inbox would have held a tick
later), or as said at its place, where the place's log takes it as usual and everyone
there overhears it, but no listener gets it as mail again (`answered_at_once`).
"""

from __future__ import annotations

from collections.abc import Iterable

from sim.wire.events import AnyEvent, Speech

__all__ = ["OUTSIDE_SEQ", "EarlyMail", "answered_at_once"]

OUTSIDE_SEQ = 1_000_000
"""An outside input's event is numbered from here, after every line its speaker says in a tick."""


def answered_at_once(event: AnyEvent) -> bool:
    """Whether `event` is an outside player's input, which its addressee answered in the tick
    that took it (its id's number, `event_id`'s last part, is at least `OUTSIDE_SEQ`)."""
    if not isinstance(event, Speech) or not event.from_player:
        return False
    seq = event.id.rpartition(":")[2]
    return seq.isdigit() and int(seq) >= OUTSIDE_SEQ


class EarlyMail:
    """The outside input taken this tick, by addressee, until its turn in the same tick."""

    def __init__(self) -> None:
        self._at_place: dict[str, list[Speech]] = {}
        self._direct: dict[str, list[Speech]] = {}

    def put(self, event: Speech, *, at_place: bool) -> None:
        """`event` said to `event.to`: at its place (the place's log holds it), or directly."""
        if event.to is None:
            raise ValueError(f"outside input {event.id!r} has no addressee")
        (self._at_place if at_place else self._direct).setdefault(event.to, []).append(event)

    def holders(self) -> Iterable[str]:
        """The NPCs that have such input waiting."""
        return {*self._at_place, *self._direct}

    def take(self, npc: str) -> tuple[list[Speech], list[Speech]]:
        """What waits for `npc`: (said at its place, said directly), taken."""
        return self._at_place.pop(npc, []), self._direct.pop(npc, [])

    def clear(self) -> None:
        """Forget what a tick cut short left (it runs again and takes its input again)."""
        self._at_place.clear()
        self._direct.clear()
