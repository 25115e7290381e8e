"""Checks over parts of a scenario that need no `Scenario`: the shared world against the
world-state topic, and the day (exits, schedules) against the places.

Each raises one `ScenarioError` line naming the file and the entry at fault, as the loader's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from sim.day import ScheduleEntry, check_schedule
from sim.errors import ScenarioError
from sim.memory import WorldFact
from sim.protocol.bounds import InputBounds, bound_problem
from sim.wire.contract import channel_named
from sim.wire.events import NAME_RULE, WorldStateMessage

if TYPE_CHECKING:  # sim.scenario imports this module
    from sim.scenario import Scenario

__all__ = ["check_day", "check_references", "check_world", "npc_at"]


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


def check_references(scenario: Scenario, source: str) -> None:
    """Ids unique, and every place, NPC and intent an entry names is the scenario's."""
    locations = {loc.id for loc in scenario.locations}
    if len(locations) != len(scenario.locations):
        raise ScenarioError(f"{source}: locations: duplicate location id")
    npc_ids: set[str] = set()
    for i, npc in enumerate(scenario.npcs):
        if npc.id in npc_ids:
            raise ScenarioError(f"{npc_at(source, npc.id, i)}, field id: duplicate NPC id {npc.id!r}")
        npc_ids.add(npc.id)
        if npc.location not in locations:
            raise ScenarioError(f"{npc_at(source, npc.id, i)}, field location: unknown location {npc.location!r}")
        if npc.intents and npc.output != "structured":
            raise ScenarioError(f"{npc_at(source, npc.id, i)}, field intents: intents need output = \"structured\"")
        for field, ids in (
            ("facts", [f.id for f in npc.facts]),
            ("episodic", [e.id for e in npc.episodic]),
            ("beliefs", [b.id for b in npc.beliefs]),
            ("world", [w.key for w in npc.world]),
        ):
            if len(ids) > 1 and len(set(ids)) != len(ids):  # a million NPCs: no Counter for each list
                raise ScenarioError(f"{npc_at(source, npc.id, i)}, field {field}: duplicate ids {_duplicates(ids)}")
    player_ids: set[str] = set()
    for i, player in enumerate(scenario.players):
        where = f"{source}: player {player.id!r} (players[{i}])"
        if player.id in npc_ids or player.id in player_ids:
            raise ScenarioError(f"{where}, field id: id {player.id!r} is already taken")
        player_ids.add(player.id)
        if player.location is not None and player.location not in locations:
            raise ScenarioError(f"{where}, field location: unknown location {player.location!r}")
        for j, line in enumerate(player.script):
            if line.to not in npc_ids:
                raise ScenarioError(f"{where}, field script[{j}].to: unknown NPC {line.to!r}")


def npc_at(source: str, npc_id: object, index: int) -> str:
    """How an error names an NPC: the file, its id and its index."""
    return f"{source}: npc {npc_id!r} (npcs[{index}])"


def _duplicates(ids: Iterable[str]) -> list[str]:
    """The ids that occur more than once, sorted: one pass over the list."""
    return sorted(x for x, n in Counter(ids).items() if n > 1)
