"""A shard's layout: its NPCs, their places and kinds' names, who stands where, and the dice table.

All of it follows from the scenario, `--shard i/n` and the seed alone, and at 1,000,000
NPCs it takes seconds to build, so a shard process builds it once, off the event loop (in
the start-up thread, sim.shard._startup), and hands it to its `ShardContext`; the context
builds it itself when given none (tests, embedders).
"""

from __future__ import annotations

from sim.scenario import NpcSpec, Scenario
from sim.shard._dice import AmbientDice
from sim.shard._place_shares import assign_places
from sim.shard._run_config import parse_shard, shard_npcs
from sim.shard._whereabouts import Whereabouts

__all__ = ["ShardLayout"]


class ShardLayout:
    """What shard `shard` ("i/n") holds of `scenario`, and what its NPCs need to know of the others."""

    def __init__(self, scenario: Scenario, shard: str, seed: int) -> None:
        self.index, self.count = parse_shard(shard)
        owner = assign_places(scenario, self.count)
        self.owned = frozenset(place for place, index in owner.items() if index == self.index)
        """The places this shard holds (their chronicles; outside events there are its to take)."""
        self.specs: list[NpcSpec] = shard_npcs(scenario, self.index, self.count, owner)
        """This shard's NPCs, in id order."""
        self.by_id = {spec.id: spec for spec in self.specs}
        """This shard's NPCs by id (the scenario's own index of all NPCs is never built)."""
        self.local = self.by_id.keys()
        self.kinds: dict[str, str] = {}
        """Each kind this shard's NPCs name, to the first NPC naming it (the one an error names);
        plain names: the context resolves them to classes (sim.shard._context)."""
        for spec in self.specs:
            self.kinds.setdefault(spec.kind, spec.id)
        self.whereabouts = Whereabouts(scenario, owner)
        self.npc_location = self.whereabouts.where
        """Every NPC of the run (in any shard), to where it stands now."""
        places: dict[str, list[str]] = {}
        for spec in self.specs:
            places.setdefault(spec.location, []).append(spec.id)
        self.places = {place: tuple(ids) for place, ids in places.items()}
        """This shard's places, to its NPCs there when the run begins."""
        self.dice = AmbientDice(seed, self.specs)
