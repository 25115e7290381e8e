"""`RecordedInputs`: what came from outside a run, by tick, for a shard that re-executes it.

A run's outside inputs (players' JSON on the input topic) and world-state changes (the game
system's, on the world-state topic) arrive when they arrive; the store keeps each with the
tick it took effect at (`inputs`, `world_changes`). A shard given these (sim.replay) takes
them at those ticks instead of what arrives on its bus, so the run they belong to is
executed again exactly.
"""

from __future__ import annotations

import msgspec

__all__ = ["RecordedInputs"]


class RecordedInputs(msgspec.Struct, frozen=True, kw_only=True):
    """`inputs[tick]`: (seq, player, NPC, text) in seq order, the seq the run gave each (it
    names the input's event); `world[tick]`: the keys and values set at the start of that tick."""

    inputs: dict[int, list[tuple[int, str, str, str]]] = {}
    world: dict[int, dict[str, str]] = {}
