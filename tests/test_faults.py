"""The fault harness (tests/faults): its schedules' properties, and a fixed set of seeds run for real.

The generator is pure, so its properties are checked on many seeds (hypothesis); the fixed
seeds below each run a schedule against real processes (Mosquitto, `npcsim run` shards, a
network namespace, the fault proxy, the fake model server) and must pass every check of
tests/faults/runner.py. The other seeds are the soak: `make faults SEEDS=50`.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.faults.__main__ import seeds
from tests.faults.runner import run_schedule
from tests.faults.schedule import (
    FIRST,
    GAP,
    MAX_DURATION_S,
    MODEL,
    PARTITION,
    PROXY_RESET,
    PROXY_STALL,
    SHARD_KILL,
    TAIL,
    WORKER_KILL,
    draw,
)
from tests.helpers import require_mosquitto

SEEDS = st.integers(min_value=0, max_value=2**32)
NETWORK = (PARTITION, PROXY_RESET, PROXY_STALL)


@given(SEEDS)
def test_a_seed_gives_one_schedule(seed: int) -> None:
    assert draw(seed) == draw(seed)
    assert draw(seed).describe() == draw(seed).describe()


@given(SEEDS, st.sampled_from(["village", "generated", None]), st.sampled_from([1, 2, 3, None]))
def test_the_faults_fall_within_the_run_and_are_bounded(seed: int, world: str | None, shards: int | None) -> None:
    s = draw(seed, world=world, shards=shards)
    assert (world or s.world) == s.world and (shards or s.shards) == s.shards
    assert 1 <= s.shards <= 3 and s.world in ("village", "generated")
    assert s.faults, "every schedule injects something"
    for fault in s.faults:
        assert FIRST <= fault.tick < s.ticks - TAIL, fault
        assert 0 <= fault.duration_s <= MAX_DURATION_S, fault
        assert 0 <= fault.target < s.shards, fault
    for tick in [i.tick for i in s.inputs] + [w.tick for w in s.world_changes]:
        assert 1 <= tick < s.ticks - TAIL, s


@given(SEEDS)
def test_the_faults_never_overlap_in_a_way_the_runner_cannot_do(seed: int) -> None:
    s = draw(seed)
    starts = [f.tick for f in s.faults]
    assert all(b - a >= GAP for a, b in itertools.pairwise(starts)), starts  # one after another
    kinds = {f.kind for f in s.faults}
    assert not (PARTITION in kinds and kinds & {PROXY_RESET, PROXY_STALL}), kinds  # the namespace or the proxy
    if kinds & set(MODEL):  # the model server is on loopback: no namespace, no proxy, no workers
        assert not kinds & {*NETWORK, WORKER_KILL}, kinds
    assert len({f.target for f in s.faults if f.kind in NETWORK}) <= 1, s.faults  # one shard behind them
    assert (s.workers > 0) == (WORKER_KILL in kinds)


@given(SEEDS)
def test_every_shard_kill_has_inputs_in_its_tick(seed: int) -> None:
    s = draw(seed)
    kills = [f.tick for f in s.faults if f.kind == SHARD_KILL]
    assert sorted(kills) == sorted(i.tick for i in s.inputs if i.player.startswith("k") and i.player.endswith("b"))
    assert sorted(t - 1 for t in kills) == sorted(i.tick for i in s.inputs if i.player.startswith("k")
                                                  and i.player.endswith("a"))
    assert len({i.text for i in s.inputs}) == len(s.inputs), "each input is told apart by its text"


def test_seeds_are_counts_lists_and_ranges() -> None:
    assert seeds(["3"]) == [1, 2, 3]
    assert seeds(["4", "9"]) == [4, 9]
    assert seeds(["2-4", "7"]) == [2, 3, 4, 7]


# A broker kill (village, 3 shards), a partition (generated, 1 shard), the proxy's stalls on
# a slow link (generated, 3) and its reset (village, 3), a slow and a hanging model server
# (village, 2), model-server 500s (generated, 3): about three minutes. NPCSIM_FAULT_SEEDS="..."
# runs others.
FIXED = [int(s) for s in os.environ.get("NPCSIM_FAULT_SEEDS", "3 6 17 22 46 26").split()]


@pytest.mark.mosquitto
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", FIXED)
async def test_a_fixed_schedule_holds(seed: int, tmp_path: Path) -> None:
    require_mosquitto()
    schedule = draw(seed)
    if schedule.netns and os.geteuid() != 0:
        pytest.skip("a partition needs root (ip netns)")
    outcome = await run_schedule(schedule, tmp_path)
    assert outcome.ok, f"{schedule.describe()}\n" + "\n".join(f"  - {p}" for p in outcome.problems)
    assert outcome.faults == len(schedule.faults)
