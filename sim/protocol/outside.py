"""Outside input (players' JSON, the game system's world state, events, facts and players'
presence): its named types, and which tick takes each arrival. Sans-I/O.

An input from outside arrives whenever its client sends it; the shard takes it at a phase
boundary: player input, presence, events and facts with the tick whose inputs are still
open, world state with the tick whose TickDone (shard 0's) still takes it.
`OutsideJournal` stamps each arrival, as the bus receives it, with that tick, so that a
journal on disk (sim.store's arrivals) lets a resumed shard take it at the same tick; each
stamp moves on the moment its phase takes what arrived.

What a tick takes (`Taken`) is numbered by `seq` in the order taken; the store records it
with its tick, and a re-execution takes the same at the same tick (sim.shard's
`RecordedInputs`).
"""

from __future__ import annotations

from collections.abc import Container

import msgspec

from sim.protocol.received import (
    GameEventReceived,
    GameFactReceived,
    Outside,
    PlayerInputReceived,
    PresenceReceived,
    WorldStateReceived,
)

__all__ = [
    "Arrival", "GameEvent", "GameFact", "InputArrival", "OutsideInput", "OutsideJournal", "Presence", "Taken",
    "WorldArrival", "taken_of",
]


class OutsideInput(msgspec.Struct, frozen=True, kw_only=True, order=True, tag="input"):
    """A player's input to NPC `to`; `id` is the one its client gave it (or None). `seq`
    numbers the tick's outside inputs in the order they were taken (it names the input's
    event); ordered by seq first."""

    seq: int = 0
    player: str
    to: str
    text: str
    id: str | None = None


class Presence(msgspec.Struct, frozen=True, kw_only=True, tag="presence"):
    """Player `player` stands at `location` from this tick on (None: nowhere)."""

    seq: int = 0
    player: str
    location: str | None


class GameEvent(msgspec.Struct, frozen=True, kw_only=True, tag="event"):
    """Something happened at `location`: a Notice there."""

    seq: int = 0
    location: str
    text: str
    significance: float


class GameFact(msgspec.Struct, frozen=True, kw_only=True, tag="fact"):
    """A canonical fact for NPC `npc`, or for every NPC when None."""

    seq: int = 0
    npc: str | None
    id: str
    text: str


Taken = OutsideInput | Presence | GameEvent | GameFact
"""What a tick takes from outside besides the world state."""


class InputArrival(msgspec.Struct, frozen=True, kw_only=True, tag="input"):
    """An outside input this shard takes at `tick` (its seq is given when the tick takes it)."""

    tick: int
    input: Taken


class WorldArrival(msgspec.Struct, frozen=True, kw_only=True, tag="world"):
    """A world-state change shard 0 takes into its TickDone of `tick`."""

    tick: int
    state: dict[str, str]


Arrival = InputArrival | WorldArrival


def taken_of(event: PlayerInputReceived | PresenceReceived | GameEventReceived | GameFactReceived) -> Taken:
    """What a tick takes of an outside input (numbered when taken)."""
    match event:
        case PlayerInputReceived(player=player, message=m):
            return OutsideInput(player=player, to=m.to, text=m.text, id=m.id)
        case PresenceReceived(player=player, message=m):
            return Presence(player=player, location=m.location)
        case GameEventReceived(message=m):
            return GameEvent(location=m.location, text=m.text, significance=m.significance)
        case GameFactReceived(message=m):
            return GameFact(npc=m.npc, id=m.id, text=m.text)


class OutsideJournal:
    """Which arrivals a shard journals, and with which tick.

    `local`: the shard's NPCs (player input or a fact for another shard's NPC is not this
    shard's); `places`: its places (an event elsewhere is another shard's); presence (at one
    of the run's `locations`, or nowhere) and a fact for every NPC are every shard's.
    `takes_world`: shard 0, the one shard that takes world state into its TickDone.
    """

    def __init__(self, local: Container[str], places: Container[str], locations: Container[str], *,
                 takes_world: bool, tick: int) -> None:
        self._local = local
        self._places = places
        self._locations = locations
        self._takes_world = takes_world
        self.input_tick = tick  # the tick whose inputs are still open
        self.world_tick = tick  # the tick whose TickDone still takes world state

    def takes(self, event: Outside) -> bool:
        """Whether this shard takes `event` (a retained world state is taken by none)."""
        match event:
            case PlayerInputReceived(message=message):
                return message.to in self._local
            case GameEventReceived(message=message):
                return message.location in self._places
            case GameFactReceived(message=message):
                return message.npc is None or message.npc in self._local
            case PresenceReceived(message=message):
                return message.location is None or message.location in self._locations
            case WorldStateReceived(retained=retained):
                return self._takes_world and not retained

    def stamp(self, event: Outside) -> Arrival | None:
        """The arrival to journal for `event`, stamped with the tick that takes it; None when
        this shard does not take it (another shard's NPC or place, a retained world state)."""
        if not self.takes(event):
            return None
        if isinstance(event, WorldStateReceived):
            return WorldArrival(tick=self.world_tick, state=dict(event.message.state))
        return InputArrival(tick=self.input_tick, input=taken_of(event))

    def inputs_taken(self, tick: int) -> None:
        """Tick `tick` took the outside input that arrived until now: the next arrival is the next tick's."""
        self.input_tick = tick + 1

    def world_taken(self, tick: int) -> None:
        """Tick `tick`'s TickDone took the world state that arrived until now."""
        self.world_tick = tick + 1
