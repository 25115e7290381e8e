"""Places belong to shards: whole places, balanced by NPC count, the same assignment everywhere."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.scenario import LocationSpec, NpcSpec, Scenario, ScenarioMeta
from sim.shard import assign_places, shard_npcs


def world(sizes: list[int], seed: int) -> Scenario:
    """Places `p0`, `p1`, ... with `sizes[j]` NPCs each, listed in a shuffled order."""
    npcs = [NpcSpec(id=f"n{j}-{k}", name="N", location=f"p{j}", system_prompt="You are N.")
            for j, size in enumerate(sizes) for k in range(size)]
    random.Random(seed).shuffle(npcs)
    locations = [LocationSpec(id=f"p{j}") for j in range(len(sizes))]
    random.Random(seed + 1).shuffle(locations)
    return Scenario(scenario=ScenarioMeta(name="w"), locations=locations, npcs=npcs)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=30),
       count=st.integers(min_value=1, max_value=6), seed=st.integers(min_value=0, max_value=1000))
def test_every_place_is_on_one_shard_and_the_shards_are_balanced(sizes: list[int], count: int, seed: int) -> None:
    scenario = world(sizes, seed)
    owner = assign_places(scenario, count)
    assert set(owner) == {loc.id for loc in scenario.locations}
    assert all(0 <= index < count for index in owner.values())
    load = Counter({index: 0 for index in range(count)})
    for spec in scenario.npcs:
        load[owner[spec.location]] += 1
    assert max(load.values()) - min(load.values()) <= max(sizes)
    # the same on every shard, whatever order the scenario lists things in
    assert assign_places(world(sizes, seed + 7), count) == owner
    held = [shard_npcs(scenario, index, count) for index in range(count)]
    assert sorted(spec.id for part in held for spec in part) == sorted(spec.id for spec in scenario.npcs)
    for index, part in enumerate(held):
        assert [spec.id for spec in part] == sorted(spec.id for spec in part)
        assert {owner[spec.location] for spec in part} <= {index}


def test_the_assignment_rule_by_example() -> None:
    """Most NPCs first, then by id; each place to the lightest shard, the lowest index on a tie."""
    scenario = world([5, 3, 3, 2, 0], seed=1)
    assert assign_places(scenario, 2) == {"p0": 0, "p1": 1, "p2": 1, "p3": 0, "p4": 1}
    assert assign_places(scenario, 1) == dict.fromkeys(("p0", "p1", "p2", "p3", "p4"), 0)
