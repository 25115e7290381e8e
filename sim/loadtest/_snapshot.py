"""One snapshot built and checked, as both parts of the load test do it, and what it broke.

The builder and checker under test are parameters so that a test can hand in a broken
builder; the sweep processes receive them by reference, so they must be module-level.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sim.checkers import Violation
from sim.loadtest._stats import ViolationRecord
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig

__all__ = ["KEEP_VIOLATIONS", "Builder", "Checker", "build_and_check", "violation_records"]

Builder = Callable[[NpcState, str, WorkingMemoryConfig], WorkingMemory]
Checker = Callable[[NpcState, str, WorkingMemoryConfig, WorkingMemory], list[Violation]]

KEEP_VIOLATIONS = 10
"""How many broken invariants are kept with their details; all of them are counted."""


def build_and_check(
    builder: Builder, checker: Checker, state: NpcState, said: str, memory: WorkingMemoryConfig
) -> tuple[WorkingMemory, list[Violation], int, int]:
    """One snapshot built and checked: the memory, its violations, build ns and check ns."""
    t0 = time.perf_counter_ns()
    wm = builder(state, said, memory)
    t1 = time.perf_counter_ns()
    violations = checker(state, said, memory, wm)
    return wm, violations, t1 - t0, time.perf_counter_ns() - t1


def violation_records(agent: str, said: str, violations: list[Violation], source: str) -> list[ViolationRecord]:
    """The violations of one snapshot as the result reports them; `source` is "sweep" or "round_trip"."""
    return [
        ViolationRecord(agent_id=agent, invariant=v.invariant, detail=v.detail, source=source, player_input=said)
        for v in violations
    ]
