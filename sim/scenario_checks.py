"""Checks over parts of a scenario that need no `Scenario`: the shared world against the
world-state topic, and the day (exits, schedules) against the places.

Each raises one `ScenarioError` line naming the file and the entry at fault, as the loader's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec

from sim.day import ScheduleEntry, check_schedule
from sim.errors import ScenarioError
from sim.memory import WorldFact
from sim.protocol.bounds import InputBounds, bound_problem
from sim.wire.contract import channel_named
from sim.wire.events import NAME_RULE, WorldStateMessage

__all__ = ["check_day", "check_world", "npc_at"]


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


def check_day(source: str, ticks_per_day: int | None, exits: Mapping[str, Sequence[str]],
              schedules: Iterable[tuple[str, Sequence[ScheduleEntry]]]) -> None:
    """Exits lead to known places; a schedule (by NPC id, in the file's order) needs a clock and fits the places."""
    for place, ways in exits.items():
        if (unknown := next((way for way in ways if way not in exits), None)) is not None:
            raise ScenarioError(f"{source}: location {place!r}, field exits: unknown location {unknown!r}")
    for i, (npc, schedule) in enumerate(schedules):
        if not schedule:
            continue
        if ticks_per_day is None:
            problem: str | None = "a schedule needs `ticks_per_day` in [scenario]"
        else:
            problem = check_schedule(schedule, exits)
        if problem is not None:
            raise ScenarioError(f"{npc_at(source, npc, i)}, field schedule: {problem}")


def npc_at(source: str, npc_id: object, index: int) -> str:
    """How an error names an NPC: the file, its id and its index."""
    return f"{source}: npc {npc_id!r} (npcs[{index}])"
