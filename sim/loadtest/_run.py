"""The whole load test: its phases in order, and the figures of the run.

Two figures, measured at the same time and labelled apart:

* the **sweep** (`_sweep`): `processes` worker processes (default: one per core) build
  and check snapshots of random agents as fast as they can. This gives snapshots/s and the
  build and check latencies.
* the **round trip** (`_round_trip`): `concurrency` asyncio tasks in this process build,
  check, then `await infer(...)` through the inference pool. This gives inferences/s and
  the round-trip latency (build + check + inference).

Every snapshot of either part goes through the independent checker (`sim.checkers`).

With several budgets and concurrencies the run is a series of phases (`_phase`), one per
(budget, concurrency) pair, budgets outermost; each phase runs for the whole `duration_s`
(or `requests`) on the same seeded agents, sized against the smallest budget. The pool is
opened once, with as many slots as the largest concurrency; a phase runs as many
requesters as its concurrency.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from sim.checkers import check_working_memory
from sim.loadtest._inference import Infer, InferenceSettings, open_inference
from sim.loadtest._phase import run_phase
from sim.loadtest._plan import LoadTestConfig, Phase, Run
from sim.loadtest._round_trip import round_trip_states
from sim.loadtest._snapshot import Builder, Checker
from sim.loadtest._stats import (
    BudgetResult,
    LoadTestResult,
    PeakRss,
    Progress,
    SweepPoint,
    TimelinePoint,
    knee_concurrency,
)
from sim.loadtest._totals import Counts, Totals
from sim.memory import WorkingMemoryConfig, build_working_memory
from sim.mqtt import redact

__all__ = ["run_loadtest"]

OpenInference = Callable[[InferenceSettings], AbstractAsyncContextManager[Infer]]


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def _budget_label(memory: WorkingMemoryConfig) -> str:
    tokens = f", {memory.max_context_tokens} tokens" if memory.max_context_tokens else ""
    return f"{memory.max_context_chars} chars{tokens}"


async def run_loadtest(
    config: LoadTestConfig,
    *,
    builder: Builder = build_working_memory,
    checker: Checker = check_working_memory,
    inference: OpenInference = open_inference,
    on_progress: Callable[[Progress], None] | None = None,
) -> LoadTestResult:
    """Run one load test and return its figures; violations are counted, never raised.

    `builder` and `checker` must be module-level functions: the sweep processes receive
    them by reference.
    """
    totals = Totals()
    rss = PeakRss()
    timeline: list[TimelinePoint] = []
    levels, memories = config.concurrencies, config.memories
    gullible = config.output == "structured" and config.backend == "scripted"
    settings = InferenceSettings(
        backend=config.backend, latency_ms=config.latency_ms,
        backend_options={**config.backend_options, "gullible": True} if gullible else config.backend_options,
        concurrency=max(levels),
        broker=config.broker, seed=config.seed,
    )
    budgets: list[BudgetResult] = []
    sweep_points: list[SweepPoint] = []
    elapsed = rt_elapsed = sweep_s = 0.0
    run_began: float | None = None
    counted = Counts()
    count = len(levels) * len(memories)
    async with contextlib.AsyncExitStack() as stack:
        infer = await stack.enter_async_context(inference(settings)) if max(levels) else None
        states = round_trip_states(config) if infer is not None else []
        run = Run(config=config, builder=builder, checker=checker, infer=infer, states=states, rss=rss,
                  on_progress=on_progress)
        for memory in memories:
            for state in states:
                builder(state, "", memory)  # as in the sweep: warm the per-state caches outside the timing
            budget_totals = Totals()
            budget_sweep_s = budget_rt_s = 0.0
            rates: list[tuple[int, float]] = []
            for level in levels:
                number = len(budgets) * len(levels) + len(rates) + 1
                phase = Phase(
                    memory=memory, concurrency=level,
                    label=f"{_budget_label(memory)}, concurrency {level}" + (f" [{number}/{count}]" if count > 1
                                                                            else ""),
                )
                outcome = await run_phase(run, phase, counted, run_began)
                run_began = outcome.run_began
                timeline.extend(outcome.timeline)
                phase_totals = outcome.totals
                counted = counted.plus(phase_totals)
                budget_totals.merge(phase_totals)
                elapsed += outcome.elapsed_s
                budget_sweep_s += outcome.sweep_s
                budget_rt_s += outcome.round_trip_s
                if level:
                    rate = _rate(phase_totals.inferences, outcome.round_trip_s)
                    rates.append((level, rate))
                    sweep_points.append(SweepPoint(
                        max_context_chars=memory.max_context_chars, max_context_tokens=memory.max_context_tokens,
                        concurrency=level, duration_s=round(outcome.round_trip_s, 3),
                        inferences=phase_totals.inferences, inferences_per_s=rate,
                        latency=phase_totals.infer.figures(), fallbacks=phase_totals.fallbacks,
                        prompt_tokens_per_s=None if phase_totals.prompt_tokens is None
                        else _rate(phase_totals.prompt_tokens, outcome.round_trip_s),
                        completion_tokens_per_s=None if phase_totals.completion_tokens is None
                        else _rate(phase_totals.completion_tokens, outcome.round_trip_s),
                        prompt_cache_share=phase_totals.cache_share,
                        proposals_per_s=None if config.output == "line"
                        else _rate(phase_totals.gates.proposals, outcome.round_trip_s),
                        server_limits=phase_totals.limits.figures,
                    ))
            budgets.append(BudgetResult(
                max_context_chars=memory.max_context_chars, max_context_tokens=memory.max_context_tokens,
                snapshots=budget_totals.sweep_snapshots + budget_totals.rt_snapshots,
                snapshots_per_s=_rate(budget_totals.sweep_snapshots, budget_sweep_s) if config.processes
                else _rate(budget_totals.rt_snapshots, budget_rt_s),
                build_latency=budget_totals.build.figures(), violations=budget_totals.violations,
                over_budget=budget_totals.over_budget, truncation=budget_totals.truncation.figures(),
                knee_concurrency=knee_concurrency(rates),
            ))
            totals.merge(budget_totals)
            rt_elapsed += budget_rt_s
            sweep_s += budget_sweep_s
    first = memories[0]
    snapshots = totals.sweep_snapshots + totals.rt_snapshots
    return LoadTestResult(
        agents=config.agents,
        seed=config.seed,
        duration_s=round(elapsed, 3),
        processes=config.processes,
        concurrency=levels[0],
        backend=config.backend,
        latency_ms=config.latency_ms,
        broker=redact(config.broker) if config.broker else None,
        max_context_chars=first.max_context_chars,
        max_context_tokens=first.max_context_tokens,
        snapshots=snapshots,
        sweep_snapshots=totals.sweep_snapshots,
        snapshots_per_s=_rate(totals.sweep_snapshots, sweep_s) if sweep_s > 0
        else _rate(totals.rt_snapshots, rt_elapsed),
        all_snapshots_per_s=_rate(snapshots, elapsed),
        inferences=totals.inferences,
        inferences_per_s=_rate(totals.inferences, rt_elapsed),
        build_latency=totals.build.figures(),
        check_latency=totals.check.figures(),
        infer_latency=totals.infer.figures(),
        round_trip_latency=totals.round_trip.figures(),
        violations=totals.violations,
        first_violations=totals.first_violations,
        over_budget=totals.over_budget,
        fallbacks=totals.fallbacks,
        peak_rss_mb=round(rss.peak_bytes / 2**20, 1),
        timeline=timeline,
        truncation=totals.truncation.figures(),
        budgets=budgets,
        sweep=sweep_points,
        output=config.output,
        gates=None if config.output == "line" else totals.gates.figures(rt_elapsed),
        server_limits=totals.limits.figures,
    )
