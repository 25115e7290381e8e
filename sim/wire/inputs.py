"""What a tick takes from outside besides the world state, as it is kept and carried: in the
arrivals journal, in the store's `inputs` table, and (the run-wide ones) in shard 0's TickDone.

`seq` numbers a tick's inputs in the order the tick took them: first the run-wide ones
(`RunWide`: a player's presence, a fact for every NPC), in the order shard 0's TickDone
lists them, then the shard's own (its NPCs' and places'). A re-execution takes the same
with the same numbers (sim.shard's `RecordedInputs`).
"""

from __future__ import annotations

from typing import Annotated, TypeGuard

import msgspec

from sim.wire.events import FactAction, Name, Text

__all__ = ["GameEvent", "GameFact", "Goal", "Move", "OutsideInput", "Presence", "RunWide", "Taken", "is_run_wide"]

_Seq = Annotated[int, msgspec.Meta(ge=0)]


class OutsideInput(msgspec.Struct, frozen=True, kw_only=True, order=True, tag="input"):
    """A player's input to NPC `to`; `id` is the one its client gave it (or None). Ordered by seq first."""

    seq: _Seq = 0
    player: str
    to: str
    text: str
    id: str | None = None


class Presence(msgspec.Struct, frozen=True, kw_only=True, tag="presence"):
    """Player `player` stands at `location` from this tick on (None: nowhere)."""

    seq: _Seq = 0
    player: Name
    location: Name | None


class GameEvent(msgspec.Struct, frozen=True, kw_only=True, tag="event"):
    """Something happened at `location`: a Notice there."""

    seq: _Seq = 0
    location: str
    text: str
    significance: float


class GameFact(msgspec.Struct, frozen=True, kw_only=True, tag="fact"):
    """A canonical fact for NPC `npc`, or for every NPC when None, added, replaced or
    withdrawn (`action`; a withdrawn fact has no text)."""

    seq: _Seq = 0
    npc: Name | None
    id: Name
    text: Text | None
    action: FactAction = "add"


class Move(msgspec.Struct, frozen=True, kw_only=True, tag="move"):
    """The game moves NPC `npc` to `location` (every shard moves it at the same tick)."""

    seq: _Seq = 0
    npc: Name
    location: Name


class Goal(msgspec.Struct, frozen=True, kw_only=True, tag="goal"):
    """NPC `npc`'s current goal as the game sets it; None clears it."""

    seq: _Seq = 0
    npc: Name
    goal: Text | None


Taken = OutsideInput | Presence | GameEvent | GameFact | Move | Goal
"""What a tick takes from outside besides the world state."""

RunWide = Presence | GameFact | Move
"""What every shard takes at the same tick (a presence; a fact whose `npc` is None; a move):
shard 0 takes it into its TickDone, every shard applies it at the next tick."""


def is_run_wide(taken: Taken) -> TypeGuard[RunWide]:
    """Whether every shard takes `taken` (a player's presence, a fact for every NPC, a move)."""
    return isinstance(taken, Presence | Move) or (isinstance(taken, GameFact) and taken.npc is None)
