"""Checks over parts of a scenario that need no `Scenario`: the shared world against the
world-state topic.

Each raises one `ScenarioError` line naming the file and the entry at fault, as the loader's own.
"""

from __future__ import annotations

import msgspec

from sim.errors import ScenarioError
from sim.memory import WorldFact
from sim.protocol.bounds import InputBounds, bound_problem
from sim.wire.contract import channel_named
from sim.wire.events import NAME_RULE, WorldStateMessage

__all__ = ["check_world"]


def check_world(world: list[WorldFact], source: str) -> None:
    """The shared world state as the world-state topic would take it (see sim.scenario's docstring)."""
    bounds = InputBounds()
    for i, fact in enumerate(world):
        where = f"{source}: world[{i}], key {fact.key[:80]!r}"
        try:
            entry = msgspec.convert({"state": {fact.key: fact.value}}, WorldStateMessage)
        except msgspec.ValidationError:
            raise ScenarioError(
                f"{where}: the world-state topic carries only keys of {NAME_RULE}"
            ) from None
        if (problem := bound_problem(channel_named("world-state").bound, entry, bounds)) is not None:
            raise ScenarioError(f"{where}: {problem}, over what the world-state topic accepts")
    if len(world) > bounds.world_keys:
        raise ScenarioError(f"{source}: world: {len(world)} keys, over the {bounds.world_keys} the world-state "
                            "topic accepts")
