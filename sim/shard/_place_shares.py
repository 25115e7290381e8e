"""Which shard holds which place: whole places, balanced by NPC count, the same on every shard.

An NPC belongs to the shard that holds its home place (its scenario `location`), so while
nobody walks, everyone who can hear a line said at a place is on one shard: the place's
events travel through the broker only when someone outside that shard says them (shard 0's
scripted players, outside input) or, in a world whose NPCs walk, when an NPC of another
shard stands there (sim.shard._whereabouts). The assignment is a function of the scenario and the shard count alone:

    places sorted by NPC count (most first), then id; each goes to the shard holding the
    fewest NPCs so far, the lowest index on a tie.

This greedy rule (longest processing time first) keeps the most loaded shard within the
largest place's NPC count of the least loaded one. Places without NPCs are assigned too
(every place is on exactly one shard), at the end, where they weigh nothing.
"""

from __future__ import annotations

import heapq
from collections import Counter

from sim.scenario import Scenario

__all__ = ["assign_places"]


def assign_places(scenario: Scenario, count: int) -> dict[str, int]:
    """Every location id of the scenario, mapped to the index of the shard that holds it."""
    if count < 1:
        raise ValueError(f"need at least one shard, got {count}")
    npcs = Counter(spec.location for spec in scenario.npcs)
    order = sorted((loc.id for loc in scenario.locations), key=lambda place: (-npcs[place], place))
    shards = [(0, index) for index in range(count)]  # (NPCs so far, index): a heap, lightest first
    owner: dict[str, int] = {}
    for place in order:
        load, index = heapq.heappop(shards)
        owner[place] = index
        heapq.heappush(shards, (load + npcs[place], index))
    return owner
