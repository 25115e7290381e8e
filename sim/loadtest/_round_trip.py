"""The round trip: asyncio tasks in this process, each building, checking and inferring in a loop.

Each of a phase's `concurrency` requesters picks an agent, builds, checks, then awaits
`infer(...)` through the inference pool. This gives inferences/s and the round-trip
latency (build + check + inference). Each task yields to the event loop after every round
trip, so that the once-a-second monitor (timeline, live display, RSS) runs even when the
backend answers without suspending.
"""

from __future__ import annotations

import asyncio
import random
import time

from sim.loadtest._inference import Infer
from sim.loadtest._plan import LoadTestConfig, Phase, Run
from sim.loadtest._proposals import POLICY, pick_structured_input
from sim.loadtest._snapshot import build_and_check, violation_records
from sim.loadtest._states import generate_state, pick_input
from sim.loadtest._totals import Totals
from sim.memory import NpcState

__all__ = ["RequestBudget", "requester", "round_trip_states"]


class RequestBudget:
    """Hands out round trips until the deadline or the request count is reached."""

    def __init__(self, deadline: float | None, requests: int | None) -> None:
        self._deadline = deadline
        self._left = requests
        self.tick = 0

    def take(self) -> int | None:
        """The next request's tick, or None when the phase is over."""
        if self._deadline is not None and time.perf_counter() >= self._deadline:
            return None
        if self._left is not None:
            if self._left <= 0:
                return None
            self._left -= 1
        self.tick += 1
        return self.tick


def round_trip_states(config: LoadTestConfig) -> list[NpcState]:
    """Every agent, generated once for all phases (sized against the smallest budget)."""
    return [generate_state(config.seed, i, config.sizing_chars) for i in range(config.agents)]


async def requester(worker: int, run: Run, phase: Phase, infer: Infer, budget: RequestBudget, totals: Totals) -> None:
    """One of the phase's requesters: round trips into `totals` until `budget` says the phase is over.

    `infer` is `run.infer`, known here not to be None (the round trip is on).
    """
    config = run.config
    rng = random.Random(f"npcsim-loadtest:{config.seed}:round-trip:{worker}")
    memory = phase.memory
    clock = time.perf_counter_ns
    structured = config.output == "structured"
    output = POLICY if structured else None
    while (tick := budget.take()) is not None:
        state = run.states[rng.randrange(config.agents)]
        said = pick_structured_input(rng, state) if structured else pick_input(rng)
        t0 = clock()
        wm, violations, build_ns, check_ns = build_and_check(run.builder, run.checker, state, said, memory)
        t2 = clock()
        answer = await infer(wm, tick, output)
        t3 = clock()
        if structured:
            totals.gates.record(answer.attempts, wm, said)
        totals.rt_snapshots += 1
        totals.inferences += 1
        totals.fallbacks += answer.fallback
        totals.add_tokens(answer.prompt_tokens, answer.completion_tokens, answer.cached_tokens)
        totals.limits.record(answer.server_limits)
        totals.count_snapshot(wm)
        if violations:
            totals.add_violations(violation_records(state.agent_id, said, violations, "round_trip"), len(violations))
        totals.infer.record(t3 - t2)
        totals.round_trip.record(t3 - t0)
        totals.interval_rt.record(t3 - t0)
        if not config.processes:  # without a sweep, the round trip's builds are the build figures
            totals.build.record(build_ns)
            totals.interval_build.record(build_ns)
            totals.check.record(check_ns)
        # A backend that answers without suspending would otherwise starve the monitor.
        await asyncio.sleep(0)
