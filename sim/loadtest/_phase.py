"""One phase of the run: the sweep and the round trip side by side, and the once-a-second monitor.

A phase runs for the whole `duration_s` (or `requests`) at one budget and one concurrency.
The monitor samples RSS, adds a timeline point and updates the live display every
interval, on a fixed grid from the phase's start; the sweep's figures are put back, at
the end, into the intervals the processes measured them in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec

from sim.loadtest._plan import Phase, Run
from sim.loadtest._round_trip import RequestBudget, requester
from sim.loadtest._stats import Histogram, Progress, TimelinePoint
from sim.loadtest._sweep import open_sweep
from sim.loadtest._totals import Counts, Totals

__all__ = ["PhaseOutcome", "run_phase"]

_TIMELINE_S = 1.0
_LATE_S = 0.25  # how late after a phase's end a timeline beat may still count


class _PhaseState(msgspec.Struct, frozen=True, kw_only=True):
    """One phase as it runs: its counts, its place on the run's clock, what the monitor writes.

    `before` holds the run's counts before this phase; `intervals` are the timeline points'
    (start, end) in seconds into the phase, with the round trip's snapshots in each.
    """

    phase: Phase
    before: Counts
    totals: Totals
    run_began: float
    began: float
    deadline: float | None
    done: asyncio.Event
    points: list[TimelinePoint] = msgspec.field(default_factory=list)
    intervals: list[tuple[float, float, int]] = msgspec.field(default_factory=list)


class PhaseOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What one phase counted, its timeline, and its times (`run_began`: the run's start, for the next)."""

    totals: Totals
    timeline: list[TimelinePoint]
    run_began: float
    elapsed_s: float
    round_trip_s: float
    sweep_s: float


async def _monitor(run: Run, state: _PhaseState) -> None:
    """Every interval, on a fixed grid from the phase's start: sample RSS, add a timeline point, show progress.

    A beat that comes less than half an interval after the previous one (the loop was
    busy and the beats bunched up) is folded into the next, so that no point's rate is a
    backlog divided by a sliver of time.
    """
    config, phase, before, totals = run.config, state.phase, state.before, state.totals
    began, done = state.began, state.done
    loop = asyncio.get_running_loop()
    offset = loop.time() - time.perf_counter()  # the grid in the loop's clock
    last_t, last_snap, last_inf, last_rt = began, 0, 0, 0
    beat = 0
    while not done.is_set():
        beat += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(began + beat * _TIMELINE_S + offset):
                await done.wait()
        now = time.perf_counter()
        dt = max(now - last_t, 1e-9)
        if dt < _TIMELINE_S / 2 and not done.is_set():
            continue  # a late beat just before this one: fold this short interval into the next point
        snaps = totals.sweep_snapshots + totals.rt_snapshots
        rss_mb = run.rss.sample() / 2**20
        point = TimelinePoint(
            t_s=round(now - state.run_began, 3),
            snapshots_per_s=round((snaps - last_snap) / dt, 1),
            inferences_per_s=round((totals.inferences - last_inf) / dt, 1),
            build_p50_ms=round(totals.interval_build.percentile_ms(50), 4),
            round_trip_p50_ms=round(totals.interval_rt.percentile_ms(50), 4),
            rss_mb=round(rss_mb, 1),
            max_context_chars=phase.memory.max_context_chars,
            concurrency=phase.concurrency,
        )
        if not done.is_set() and (state.deadline is None or now <= state.deadline + _LATE_S):
            state.points.append(point)  # an interval that ends after the phase's end is not a measurement
            state.intervals.append((last_t - began, now - began, totals.rt_snapshots - last_rt))
        totals.interval_build, totals.interval_rt = Histogram(), Histogram()
        last_t, last_snap, last_inf, last_rt = now, snaps, totals.inferences, totals.rt_snapshots
        if run.on_progress is not None:
            run.on_progress(Progress(
                elapsed_s=now - began, planned_s=config.duration_s, requests=config.requests,
                snapshots=before.snapshots + snaps, snapshots_per_s=point.snapshots_per_s,
                inferences=before.inferences + totals.inferences, inferences_per_s=point.inferences_per_s,
                violations=before.violations + totals.violations, over_budget=before.over_budget + totals.over_budget,
                fallbacks=before.fallbacks + totals.fallbacks, rss_mb=rss_mb, phase=phase.label,
            ))


def _rebin_sweep(state: _PhaseState) -> list[TimelinePoint]:
    """The phase's points with the sweep's figures put in the intervals the processes measured them in."""
    rebinned = []
    for point, (start, end, rt_snapshots) in zip(state.points, state.intervals, strict=True):
        builds = Histogram()
        snapshots = rt_snapshots
        for t, count, histogram in state.totals.sweep_marks:
            if start < t <= end:
                snapshots += count
                builds.merge(histogram)
        rebinned.append(msgspec.structs.replace(
            point, snapshots_per_s=round(snapshots / (end - start), 1),
            build_p50_ms=round(builds.percentile_ms(50), 4),
        ))
    return rebinned


async def run_phase(run: Run, phase: Phase, before: Counts, run_began: float | None) -> PhaseOutcome:
    """Run one phase; `run_began` is None for the first, whose start is then the run's."""
    config = run.config
    totals = Totals()
    rounds = phase.concurrency > 0
    sweep_quota = config.requests if not rounds else None
    async with contextlib.AsyncExitStack() as stack:
        sweep = await stack.enter_async_context(
            open_sweep(config, phase.memory, run.builder, run.checker, sweep_quota)
        ) if config.processes else None
        if sweep is not None:
            await sweep.wait_ready()
        run.rss.sample()
        began = time.perf_counter()
        state = _PhaseState(
            phase=phase, before=before, totals=totals, run_began=began if run_began is None else run_began,
            began=began, deadline=began + config.duration_s if config.duration_s is not None else None,
            done=asyncio.Event(),
        )
        rt_elapsed = 0.0
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_monitor(run, state))
            if sweep is not None:
                sweep.start()
                tg.create_task(sweep.pump(totals))
            if rounds and run.infer is not None:
                budget = RequestBudget(state.deadline, config.requests)
                async with asyncio.TaskGroup() as requesters:
                    for worker in range(phase.concurrency):
                        requesters.create_task(requester(worker, run, phase, run.infer, budget, totals))
                rt_elapsed = time.perf_counter() - began
            elif state.deadline is not None:
                await asyncio.sleep(max(0.0, state.deadline - time.perf_counter()))
            if sweep is not None and sweep_quota is None:
                sweep.stop()
            state.done.set()
        elapsed = time.perf_counter() - began
        run.rss.sample()
    return PhaseOutcome(
        totals=totals, timeline=_rebin_sweep(state) if sweep is not None else state.points,
        run_began=state.run_began, elapsed_s=elapsed, round_trip_s=rt_elapsed,
        sweep_s=sweep.active_s if sweep is not None else 0.0,
    )
