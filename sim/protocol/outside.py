"""Outside input (players' JSON, the game system's world state, events, facts and players'
presence): which shard takes each arrival, and at which tick. Sans-I/O.

An input from outside arrives whenever its client sends it; the shard takes it at a phase
boundary: a player's input, an event and a fact for one NPC with the tick whose inputs are
still open (on the shard that holds the NPC or the place); what every shard takes (world
state, a player's presence, a fact for every NPC) shard 0 alone takes, with the tick whose
TickDone still takes it, and every shard applies it at the next tick, the same tick
everywhere. `OutsideJournal` stamps each arrival, as the bus receives it, with that tick, so
that a journal on disk (sim.store's arrivals) lets a resumed shard take it at the same
tick; each stamp moves on the moment its phase takes what arrived.

What a tick takes (sim.wire.inputs) is numbered by `seq` in the order taken; the store
records it with its tick, and a re-execution takes the same at the same tick (sim.shard's
`RecordedInputs`).
"""

from __future__ import annotations

from collections.abc import Container

import msgspec

from sim.protocol.received import OutsideReceived
from sim.wire.events import (
    GameEventMessage,
    GameFactMessage,
    GoalMessage,
    MoveMessage,
    PlayerInputMessage,
    PresenceMessage,
    WorldStateMessage,
)
from sim.wire.inputs import GameEvent, GameFact, Goal, Move, OutsideInput, Presence, RunWide, Taken, is_run_wide

__all__ = ["Arrival", "InputArrival", "OutsideJournal", "RunWideArrival", "WorldArrival", "taken_of"]


class InputArrival(msgspec.Struct, frozen=True, kw_only=True, tag="input"):
    """An outside input this shard takes at `tick` (its seq is given when the tick takes it)."""

    tick: int
    input: Taken


class WorldArrival(msgspec.Struct, frozen=True, kw_only=True, tag="world"):
    """A world-state change shard 0 takes into its TickDone of `tick`."""

    tick: int
    state: dict[str, str]


class RunWideArrival(msgspec.Struct, frozen=True, kw_only=True, tag="run_wide"):
    """A presence or a fact for every NPC shard 0 takes into its TickDone of `tick`."""

    tick: int
    input: RunWide


Arrival = InputArrival | WorldArrival | RunWideArrival


def taken_of(event: OutsideReceived) -> Taken:
    """What a tick takes of an outside input other than a world state (numbered when taken)."""
    match event.message:
        case PlayerInputMessage() as m:
            return OutsideInput(player=event.name, to=m.to, text=m.text, id=m.id)
        case PresenceMessage() as m:
            return Presence(player=event.name, location=m.location)
        case GameEventMessage() as m:
            return GameEvent(location=m.location, text=m.text, significance=m.significance)
        case GameFactMessage() as m:
            return GameFact(npc=m.npc, id=m.id, text=m.text, action=m.action)
        case MoveMessage() as m:
            return Move(npc=m.npc, location=m.location)
        case GoalMessage() as m:
            return Goal(npc=m.npc, goal=m.goal)
    raise ValueError(f"{event.channel}: a world state is not taken as an input")


class OutsideJournal:
    """Which arrivals a shard journals, and with which tick.

    `local`: the shard's NPCs (player input or a fact for another shard's NPC is not this
    shard's); `places`: its places (an event elsewhere is another shard's); `locations`:
    the run's places (a presence elsewhere is refused before it gets here); `npcs`: the
    run's NPCs (a move of an unknown NPC is refused, never journaled).
    `shard_zero`: the one shard that takes what every shard applies (world state, presence,
    a fact for every NPC) into its TickDone.
    """

    def __init__(self, local: Container[str], places: Container[str], locations: Container[str], *,
                 shard_zero: bool, tick: int, npcs: Container[str] = ()) -> None:
        self._local = local
        self._npcs = npcs
        self._places = places
        self._locations = locations
        self._shard_zero = shard_zero
        self.input_tick = tick  # the tick whose inputs are still open
        self.done_tick = tick  # the tick whose TickDone still takes what every shard applies

    def takes(self, event: OutsideReceived) -> bool:
        """Whether this shard takes `event` (a retained world state is taken by none)."""
        match event.message:
            case PlayerInputMessage(to=to):
                return to in self._local
            case GameEventMessage(location=location):
                return location in self._places
            case GameFactMessage(npc=npc) if npc is not None:
                return npc in self._local
            case GameFactMessage():
                return self._shard_zero
            case MoveMessage(npc=npc, location=location):
                return self._shard_zero and npc in self._npcs and location in self._locations
            case GoalMessage(npc=npc):
                return npc in self._local
            case PresenceMessage(location=location):
                return self._shard_zero and (location is None or location in self._locations)
            case WorldStateMessage():
                return self._shard_zero and not event.retained

    def stamp(self, event: OutsideReceived) -> Arrival | None:
        """The arrival to journal for `event`, stamped with the tick that takes it; None when
        this shard does not take it (another shard's NPC or place, a retained world state)."""
        if not self.takes(event):
            return None
        if isinstance(event.message, WorldStateMessage):
            return WorldArrival(tick=self.done_tick, state=dict(event.message.state))
        taken = taken_of(event)
        if is_run_wide(taken):
            return RunWideArrival(tick=self.done_tick, input=taken)
        return InputArrival(tick=self.input_tick, input=taken)

    def inputs_taken(self, tick: int) -> None:
        """Tick `tick` took the outside input that arrived until now: the next arrival is the next tick's."""
        self.input_tick = tick + 1

    def done_taken(self, tick: int) -> None:
        """Tick `tick`'s TickDone took what every shard applies that arrived until now."""
        self.done_tick = tick + 1
