"""Outside input (players' JSON, the game system's world state): its named types, and which
tick takes each arrival. Sans-I/O.

An input from outside arrives whenever its client sends it; the shard takes it at a phase
boundary: player input with the tick whose inputs are still open, world state with the
tick whose TickDone (shard 0's) still takes it. `OutsideJournal` stamps each arrival, as
the bus receives it, with that tick, so that a journal on disk (sim.store's arrivals) lets
a resumed shard take it at the same tick; each stamp moves on the moment its phase takes
what arrived.
"""

from __future__ import annotations

from collections.abc import Container

import msgspec

from sim.protocol.received import PlayerInputReceived, WorldStateReceived

__all__ = ["Arrival", "OutsideInput", "OutsideJournal", "PlayerArrival", "WorldArrival"]


class OutsideInput(msgspec.Struct, frozen=True, kw_only=True, order=True):
    """A player's input to NPC `to`, as a tick takes it: `seq` numbers the tick's outside
    inputs in the order they were taken (it names the input's event); ordered by seq first."""

    seq: int
    player: str
    to: str
    text: str


class PlayerArrival(msgspec.Struct, frozen=True, kw_only=True, tag="player"):
    """A player's input to an NPC of this shard, taken at `tick`."""

    tick: int
    player: str
    to: str
    text: str


class WorldArrival(msgspec.Struct, frozen=True, kw_only=True, tag="world"):
    """A world-state change shard 0 takes into its TickDone of `tick`."""

    tick: int
    state: dict[str, str]


Arrival = PlayerArrival | WorldArrival


class OutsideJournal:
    """Which arrivals a shard journals, and with which tick.

    `local`: the shard's NPCs (player input to another shard's NPC is not this shard's);
    `takes_world`: shard 0, the one shard that takes world state into its TickDone.
    """

    def __init__(self, local: Container[str], *, takes_world: bool, tick: int) -> None:
        self._local = local
        self._takes_world = takes_world
        self.input_tick = tick  # the tick whose inputs are still open
        self.world_tick = tick  # the tick whose TickDone still takes world state

    def stamp(self, event: PlayerInputReceived | WorldStateReceived) -> Arrival | None:
        """The arrival to journal for `event`, stamped with the tick that takes it; None when
        this shard does not take it (another shard's NPC, a retained world state)."""
        match event:
            case PlayerInputReceived(player=player, message=message) if message.to in self._local:
                return PlayerArrival(tick=self.input_tick, player=player, to=message.to, text=message.text)
            case WorldStateReceived(message=message, retained=False) if self._takes_world:
                return WorldArrival(tick=self.world_tick, state=dict(message.state))
            case _:
                return None

    def inputs_taken(self, tick: int) -> None:
        """Tick `tick` took the player input that arrived until now: the next arrival is the next tick's."""
        self.input_tick = tick + 1

    def world_taken(self, tick: int) -> None:
        """Tick `tick`'s TickDone took the world state that arrived until now."""
        self.world_tick = tick + 1
