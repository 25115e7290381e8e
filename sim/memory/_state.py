"""The persistent state of one NPC, by authority (docs/store.md, "Authority").

Constructing an `NpcState` puts every list into recency order once, so that building a
working memory costs what it keeps, not the length of the history. Recency is a total
order: `(tick, id)` ascending, dialogue `(tick, seq)`; ties break on the remaining fields
so that the order never depends on the order of the input lists.

The state is data and imports nothing of its rendering: `NpcState` is a `dict=True` Struct
only so that the rendering side (`sim.memory.render.rendered`) can keep its per-state cache
on the object, where msgspec neither encodes nor compares it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec.structs import force_setattr

__all__ = [
    "Belief",
    "Episode",
    "Fact",
    "Line",
    "NpcState",
    "WorldFact",
    "belief_order",
    "episode_order",
    "fact_order",
    "item_text",
    "line_order",
    "world_order",
]

Tick = Annotated[int, msgspec.Meta(ge=0)]
UnitInterval = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class Fact(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A canonical fact: true in the world, never truncated; only the game replaces or withdraws one."""

    id: NonEmpty
    text: str


class WorldFact(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A world-state entry, set by the game system only."""

    key: NonEmpty
    value: str


class Episode(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An episodic memory the NPC formed; `event` names the event it remembers, if any, so
    that a line of dialogue recording the same event is known to say it already."""

    id: NonEmpty
    tick: Tick
    text: str
    significance: UnitInterval = 0.5
    event: NonEmpty | None = None


class Belief(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Something the NPC believes, with a confidence."""

    id: NonEmpty
    tick: Tick
    text: str
    confidence: UnitInterval = 0.5


class Line(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One line of dialogue; `seq` orders lines said in the same tick; `event` names the
    event it was said in, if known (an episode of that event says the same thing)."""

    tick: Tick
    speaker: str
    text: str
    seq: Annotated[int, msgspec.Meta(ge=0)] = 0
    event: NonEmpty | None = None


def fact_order(f: Fact) -> tuple[str, str]:
    return (f.id, f.text)


def world_order(w: WorldFact) -> tuple[str, str]:
    return (w.key, w.value)


def episode_order(e: Episode) -> tuple[int, str, str, float, str]:
    return (e.tick, e.id, e.text, e.significance, e.event or "")


def belief_order(b: Belief) -> tuple[int, str, str, float]:
    return (b.tick, b.id, b.text, b.confidence)


def line_order(line: Line) -> tuple[int, int, str, str, str]:
    return (line.tick, line.seq, line.speaker, line.text, line.event or "")


def item_text(item: Fact | WorldFact | Episode | Belief | Line) -> str:
    """An item as data, in one line of text: `key: value` for world state, `speaker: text` for
    a line of dialogue, the text of the others."""
    if isinstance(item, WorldFact):
        return f"{item.key}: {item.value}"
    if isinstance(item, Line):
        return f"{item.speaker}: {item.text}"
    return item.text


class NpcState(msgspec.Struct, frozen=True, dict=True, forbid_unknown_fields=True):
    """One NPC's state; every tuple is in recency order, oldest first, newest last.

    Canonical facts are ordered by id and world state by key: they have no tick, and with
    an `always_include_*` flag turned off the last in that order counts as the newest.
    """

    agent_id: NonEmpty
    system_prompt: str
    canonical_facts: tuple[Fact, ...] = ()
    world_state: tuple[WorldFact, ...] = ()
    episodic: tuple[Episode, ...] = ()
    beliefs: tuple[Belief, ...] = ()
    dialogue: tuple[Line, ...] = ()

    def __post_init__(self) -> None:
        force_setattr(self, "canonical_facts", tuple(sorted(self.canonical_facts, key=fact_order)))
        force_setattr(self, "world_state", tuple(sorted(self.world_state, key=world_order)))
        force_setattr(self, "episodic", tuple(sorted(self.episodic, key=episode_order)))
        force_setattr(self, "beliefs", tuple(sorted(self.beliefs, key=belief_order)))
        force_setattr(self, "dialogue", tuple(sorted(self.dialogue, key=line_order)))
