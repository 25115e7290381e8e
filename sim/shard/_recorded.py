"""`RecordedInputs`: what came from outside a run, by tick, for a shard that re-executes it.

A run's outside inputs (players' JSON on the input topic) and world-state changes (the game
system's, on the world-state topic) arrive when they arrive; the store keeps each with the
tick it took effect at. A shard given these as its input source (sim.replay) takes them at
those ticks, with the numbers the run gave them, and nothing that arrives on its bus, so
the run they belong to is executed again exactly.
"""

from __future__ import annotations

import msgspec

from sim.protocol.outside import OutsideInput
from sim.protocol.received import PlayerInputReceived, WorldStateReceived

__all__ = ["RecordedInputs"]


class RecordedInputs(msgspec.Struct, frozen=True, kw_only=True):
    """An input source (sim.shard._inputs): `inputs[tick]`, the outside inputs the run took
    at that tick, in seq order (every shard's: each shard takes its own NPCs'); `world[tick]`,
    the keys and values set at the start of that tick."""

    inputs: dict[int, list[OutsideInput]] = {}
    world: dict[int, dict[str, str]] = {}

    def journal(self, event: PlayerInputReceived | WorldStateReceived) -> None:
        pass  # nothing live is taken, so nothing is journaled

    def receive(self, event: PlayerInputReceived | WorldStateReceived) -> None:
        pass

    def close_inputs(self, tick: int) -> None:
        pass

    def close_world(self, tick: int) -> None:
        pass

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        return self.world.get(tick)

    def inputs_at(self, tick: int) -> list[OutsideInput]:
        return self.inputs.get(tick, [])
