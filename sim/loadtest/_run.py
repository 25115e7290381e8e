"""The load loop: a build-and-check sweep over the cores, and a round trip through the pool.

Two figures, measured at the same time and labelled apart:

* the **sweep**: `processes` worker processes (default: one per core), each generating its
  share of the agents locally from the seed (agent i goes to process i % processes),
  building each once before the clock starts (a state caches its rendered items and
  their token counts, as the server's hot state does), then building and checking snapshots of
  random agents as fast as it can. Building is CPU-bound Python, so only processes spread
  it over the cores. Each process ships counts, latency-histogram and truncation deltas
  to the parent four times a second. This gives snapshots/s and the build and check latencies.
* the **round trip**: `concurrency` asyncio tasks in this process, each looping: pick an
  agent, build, check, then `await infer(...)` through the inference pool. This gives
  inferences/s and the round-trip latency (build + check + inference). Each task yields
  to the event loop after every round trip, so that the once-a-second monitor (timeline,
  live display, RSS) runs even when the backend answers without suspending.

Every snapshot of either part goes through the independent checker (`sim.checker`).

With several budgets and concurrencies the run is a series of phases, one per (budget,
concurrency) pair, budgets outermost; each phase runs for the whole `duration_s` (or
`requests`) on the same seeded agents, sized against the smallest budget. The pool is
opened once, with as many slots as the largest concurrency; a phase runs as many
requesters as its concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import queue
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec

from sim.checker import Violation, check_working_memory
from sim.errors import ConfigError, NpcsimError
from sim.loadtest._inference import Infer, InferenceSettings, open_inference
from sim.loadtest._states import generate_state, pick_input
from sim.loadtest._stats import (
    BudgetResult,
    Histogram,
    LoadTestResult,
    PeakRss,
    SweepPoint,
    TimelinePoint,
    ViolationRecord,
    knee_concurrency,
)
from sim.loadtest._truncation import TruncationTally
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig, build_working_memory
from sim.mqtt import redact

__all__ = ["Builder", "Checker", "LoadTestConfig", "Progress", "default_processes", "run_loadtest"]

log = logging.getLogger(__name__)

Builder = Callable[[NpcState, str, WorkingMemoryConfig], WorkingMemory]
Checker = Callable[[NpcState, str, WorkingMemoryConfig, WorkingMemory], list[Violation]]
OpenInference = Callable[[InferenceSettings], AbstractAsyncContextManager[Infer]]

_KEEP_VIOLATIONS = 10
_FLUSH_S = 0.25
_BATCH = 64
_TIMELINE_S = 1.0
_SHUTDOWN_S = 15.0
_LATE_S = 0.25  # how late after a phase's end a timeline beat may still count


def default_processes() -> int:
    """One sweep process per core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class LoadTestConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One load test. Exactly one of `duration_s` and `requests` ends each phase.

    `requests` counts round trips (or, with `concurrency=0`, snapshots of the sweep).
    `processes=0` turns the sweep off; `concurrency=0` turns the round trip off.
    `concurrency` and `memory` may be tuples: one phase per (memory, concurrency) pair.
    """

    agents: int = 1000
    duration_s: float | None = 10.0
    requests: int | None = None
    concurrency: int | tuple[int, ...] = 64
    processes: int = msgspec.field(default_factory=default_processes)
    memory: WorkingMemoryConfig | tuple[WorkingMemoryConfig, ...] = msgspec.field(
        default_factory=WorkingMemoryConfig
    )
    backend: str = "scripted"
    backend_options: dict[str, Any] = msgspec.field(default_factory=dict)
    latency_ms: float = 0.0
    broker: str | None = None
    seed: int = 0

    @property
    def concurrencies(self) -> tuple[int, ...]:
        return (self.concurrency,) if isinstance(self.concurrency, int) else self.concurrency

    @property
    def memories(self) -> tuple[WorkingMemoryConfig, ...]:
        return (self.memory,) if isinstance(self.memory, WorkingMemoryConfig) else self.memory

    @property
    def sizing_chars(self) -> int:
        """The budget the agents are generated against: the smallest, so every budget sees the same agents."""
        return min(m.max_context_chars for m in self.memories)

    def __post_init__(self) -> None:
        if self.agents < 1:
            raise ConfigError(f"agents must be >= 1, got {self.agents!r}")
        if (self.duration_s is None) == (self.requests is None):
            raise ConfigError("give exactly one of duration_s and requests")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ConfigError(f"duration_s must be > 0, got {self.duration_s!r}")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"requests must be >= 1, got {self.requests!r}")
        levels = self.concurrencies
        if not levels or not self.memories:
            raise ConfigError("concurrency and memory must not be empty")
        if min(levels) < 0 or self.processes < 0:
            raise ConfigError(f"concurrency and processes must be >= 0, got {levels}, {self.processes}")
        if len(set(levels)) != len(levels):
            raise ConfigError(f"concurrency: each level once, got {levels}")
        if len(levels) > 1 and 0 in levels:
            raise ConfigError(f"concurrency 0 (sweep only) cannot be part of a list, got {levels}")
        if levels == (0,) and self.processes == 0:
            raise ConfigError("concurrency and processes are both 0: nothing would run")
        if self.latency_ms < 0:
            raise ConfigError(f"latency_ms must be >= 0, got {self.latency_ms!r}")


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """What the live display shows, taken every interval; `phase` names the budget and concurrency."""

    elapsed_s: float
    planned_s: float | None
    requests: int | None
    snapshots: int
    snapshots_per_s: float
    inferences: int
    inferences_per_s: float
    violations: int
    over_budget: int
    fallbacks: int
    rss_mb: float
    phase: str = ""


class _Totals:
    """Everything counted so far, from both parts; interval histograms feed the timeline."""

    def __init__(self) -> None:
        self.sweep_snapshots = 0
        self.rt_snapshots = 0
        self.inferences = 0
        self.violations = 0
        self.over_budget = 0
        self.fallbacks = 0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.first_violations: list[ViolationRecord] = []
        self.build = Histogram()
        self.check = Histogram()
        self.infer = Histogram()
        self.round_trip = Histogram()
        self.truncation = TruncationTally()
        self.interval_build = Histogram()
        self.interval_rt = Histogram()
        # The sweep's deltas as (seconds into the phase by the process's clock, snapshots, builds):
        # they arrive late when the event loop is busy, so the timeline is re-binned by these.
        self.sweep_marks: list[tuple[float, int, Histogram]] = []

    def add_violations(self, records: list[ViolationRecord], count: int) -> None:
        self.violations += count
        room = _KEEP_VIOLATIONS - len(self.first_violations)
        if room > 0:
            self.first_violations.extend(records[:room])

    def add_tokens(self, prompt: int | None, completion: int | None) -> None:
        if prompt is not None:
            self.prompt_tokens = (self.prompt_tokens or 0) + prompt
        if completion is not None:
            self.completion_tokens = (self.completion_tokens or 0) + completion

    def merge(self, other: _Totals) -> None:
        """Add a finished phase's counts (interval histograms are the monitor's, not merged)."""
        self.sweep_snapshots += other.sweep_snapshots
        self.rt_snapshots += other.rt_snapshots
        self.inferences += other.inferences
        self.over_budget += other.over_budget
        self.fallbacks += other.fallbacks
        self.add_tokens(other.prompt_tokens, other.completion_tokens)
        self.add_violations(other.first_violations, other.violations)
        for mine, theirs in ((self.build, other.build), (self.check, other.check), (self.infer, other.infer),
                             (self.round_trip, other.round_trip)):
            mine.merge(theirs)
        self.truncation.merge(other.truncation)

    def count_snapshot(self, wm: WorkingMemory) -> None:
        self.truncation.record(wm.report)
        if wm.report.over_budget:
            self.over_budget += 1


def _build_and_check(
    builder: Builder, checker: Checker, state: NpcState, said: str, memory: WorkingMemoryConfig
) -> tuple[WorkingMemory, list[Violation], int, int]:
    """One snapshot built and checked: the memory, its violations, build ns and check ns."""
    t0 = time.perf_counter_ns()
    wm = builder(state, said, memory)
    t1 = time.perf_counter_ns()
    violations = checker(state, said, memory, wm)
    return wm, violations, t1 - t0, time.perf_counter_ns() - t1


def _records(agent: str, said: str, violations: list[Violation], source: str) -> list[ViolationRecord]:
    return [
        ViolationRecord(agent_id=agent, invariant=v.invariant, detail=v.detail, source=source, player_input=said)
        for v in violations
    ]


# --- the sweep: worker processes -------------------------------------------------------


class _SweepJob(msgspec.Struct, frozen=True):
    """What one sweep process is told: its share, the phase's budget, its quota."""

    index: int
    processes: int
    agents: int
    seed: int
    sizing_chars: int
    memory: WorkingMemoryConfig
    quota: int | None


def _sweep_process(job: _SweepJob, builder: Builder, checker: Checker, out: Any, start: Any, stop: Any) -> None:
    """One sweep process: generate and render its share, then build and check until told."""
    try:
        _sweep_loop(job, builder, checker, out, start, stop)
    except BaseException as exc:
        out.put(("error", job.index, f"{type(exc).__name__}: {exc}"))
        raise


def _sweep_loop(job: _SweepJob, builder: Builder, checker: Checker, out: Any, start: Any, stop: Any) -> None:
    memory, quota = job.memory, job.quota
    states = [generate_state(job.seed, i, job.sizing_chars) for i in range(job.index, job.agents, job.processes)]
    for state in states:
        builder(state, "", memory)  # warm before the clock: rendering and token counts are cached per state
    out.put(("ready", job.index, None))
    start.wait()
    if stop.is_set():
        out.put(("done", job.index, _delta(0, 0, 0, Histogram(), Histogram(), TruncationTally(), [], 0.0)))
        return
    rng = random.Random(f"npcsim-loadtest:{job.seed}:sweep:{job.index}")
    began = last_flush = time.perf_counter()
    n = len(states)
    total = snapshots = over = nviolations = 0
    build, check, tally = Histogram(), Histogram(), TruncationTally()
    found: list[ViolationRecord] = []
    while not stop.is_set() and (quota is None or total < quota):
        for _ in range(_BATCH if quota is None else min(_BATCH, quota - total)):
            state = states[rng.randrange(n)]
            said = pick_input(rng)
            wm, violations, build_ns, check_ns = _build_and_check(builder, checker, state, said, memory)
            build.record(build_ns)
            check.record(check_ns)
            tally.record(wm.report)
            snapshots += 1
            total += 1
            if wm.report.over_budget:
                over += 1
            if violations:
                nviolations += len(violations)
                if len(found) < _KEEP_VIOLATIONS:
                    found.extend(_records(state.agent_id, said, violations, "sweep"))
        now = time.perf_counter()
        if now - last_flush >= _FLUSH_S:
            out.put(("progress", job.index, _delta(snapshots, over, nviolations, build, check, tally, found,
                                                   now - began)))
            snapshots = over = nviolations = 0
            build, check, tally, found = Histogram(), Histogram(), TruncationTally(), []
            last_flush = now
    out.put(("done", job.index, _delta(snapshots, over, nviolations, build, check, tally, found,
                                       time.perf_counter() - began)))


def _delta(
    snapshots: int, over: int, nviolations: int, build: Histogram, check: Histogram, tally: TruncationTally,
    found: list[ViolationRecord], active_s: float,
) -> dict[str, Any]:
    return {
        "snapshots": snapshots,
        "over_budget": over,
        "violations": nviolations,
        "found": found,
        "build": build.to_wire(),
        "check": check.to_wire(),
        "truncation": tally.to_wire(),
        "active_s": active_s,
    }


class _Sweep:
    """The parent's side of the sweep processes: readiness, start, progress, shutdown."""

    def __init__(self, procs: list[Any], out: Any, start: Any, stop: Any) -> None:
        self._procs = procs
        self._out = out
        self._start = start
        self._stop = stop
        self._ready: set[int] = set()
        self._done: set[int] = set()
        self._active: dict[int, float] = {}

    @property
    def finished(self) -> bool:
        return len(self._done) == len(self._procs)

    @property
    def active_s(self) -> float:
        """How long the sweep ran: the longest-running process's loop time."""
        return max(self._active.values(), default=0.0)

    async def _next(self) -> list[tuple[str, int, Any]]:
        """Every message waiting (at least one, unless 0.1 s pass): a busy event loop must not fall behind."""
        try:
            messages: list[tuple[str, int, Any]] = [await asyncio.to_thread(self._out.get, True, 0.1)]
        except queue.Empty:
            for i, proc in enumerate(self._procs):
                if i not in self._done and proc.exitcode is not None:
                    raise NpcsimError(
                        f"sweep process {i} exited with code {proc.exitcode} without a report"
                    ) from None
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                messages.append(self._out.get_nowait())
        for message in messages:
            if message[0] == "error":
                raise NpcsimError(f"sweep process {message[1]} failed: {message[2]}")
        return messages

    async def wait_ready(self) -> None:
        while len(self._ready) < len(self._procs):
            for kind, index, _ in await self._next():
                if kind == "ready":
                    self._ready.add(index)

    def start(self) -> None:
        self._start.set()

    def stop(self) -> None:
        self._stop.set()
        self._start.set()

    async def pump(self, totals: _Totals) -> None:
        """Fold the processes' deltas into `totals` until every process has said done."""
        while not self.finished:
            for kind, index, delta in await self._next():
                if kind == "done":
                    self._done.add(index)
                self._active[index] = delta["active_s"]
                totals.sweep_snapshots += delta["snapshots"]
                totals.over_budget += delta["over_budget"]
                totals.add_violations(delta["found"], delta["violations"])
                build = Histogram.from_wire(delta["build"])
                totals.build.merge(build)
                totals.interval_build.merge(build)
                totals.sweep_marks.append((delta["active_s"], delta["snapshots"], build))
                totals.check.merge(Histogram.from_wire(delta["check"]))
                totals.truncation.merge(TruncationTally.from_wire(delta["truncation"]))


@contextlib.asynccontextmanager
async def _open_sweep(
    config: LoadTestConfig, memory: WorkingMemoryConfig, builder: Builder, checker: Checker, quota: int | None
) -> AsyncIterator[_Sweep]:
    """Start the sweep processes (spawned: no fork of a running event loop); stop them on exit."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start, stop = ctx.Event(), ctx.Event()
    n = config.processes
    shares = [None] * n if quota is None else [quota // n + (1 if i < quota % n else 0) for i in range(n)]
    procs = [
        ctx.Process(
            target=_sweep_process,
            args=(
                _SweepJob(i, n, config.agents, config.seed, config.sizing_chars, memory, shares[i]),
                builder, checker, out, start, stop,
            ),
            name=f"npcsim-loadtest-sweep-{i}",
            daemon=True,
        )
        for i in range(n)
    ]
    sweep = _Sweep(procs, out, start, stop)
    try:
        for proc in procs:
            proc.start()
        yield sweep
    finally:
        sweep.stop()
        deadline = time.monotonic() + _SHUTDOWN_S
        for proc in procs:
            if proc.pid is None:
                continue
            await asyncio.to_thread(proc.join, max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                log.warning("sweep process %s did not stop within %.0f s: terminating it", proc.name, _SHUTDOWN_S)
                proc.terminate()
                await asyncio.to_thread(proc.join, 5.0)
        out.close()
        out.cancel_join_thread()


# --- the round trip: asyncio tasks in this process --------------------------------------


class _Budget:
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


def _round_trip_states(config: LoadTestConfig) -> list[NpcState]:
    """Every agent, generated once for all phases (sized against the smallest budget)."""
    return [generate_state(config.seed, i, config.sizing_chars) for i in range(config.agents)]


class _Phase(msgspec.Struct, frozen=True, kw_only=True):
    """One (budget, concurrency) pair of the run, and its place in the series."""

    memory: WorkingMemoryConfig
    concurrency: int
    label: str


async def _requester(
    worker: int, config: LoadTestConfig, phase: _Phase, builder: Builder, checker: Checker, infer: Infer,
    states: list[NpcState], budget: _Budget, totals: _Totals,
) -> None:
    rng = random.Random(f"npcsim-loadtest:{config.seed}:round-trip:{worker}")
    memory = phase.memory
    clock = time.perf_counter_ns
    while (tick := budget.take()) is not None:
        state = states[rng.randrange(config.agents)]
        said = pick_input(rng)
        t0 = clock()
        wm, violations, build_ns, check_ns = _build_and_check(builder, checker, state, said, memory)
        t2 = clock()
        answer = await infer(wm, tick)
        t3 = clock()
        totals.rt_snapshots += 1
        totals.inferences += 1
        totals.fallbacks += answer.fallback
        totals.add_tokens(answer.prompt_tokens, answer.completion_tokens)
        totals.count_snapshot(wm)
        if violations:
            totals.add_violations(_records(state.agent_id, said, violations, "round_trip"), len(violations))
        totals.infer.record(t3 - t2)
        totals.round_trip.record(t3 - t0)
        totals.interval_rt.record(t3 - t0)
        if not config.processes:  # without a sweep, the round trip's builds are the build figures
            totals.build.record(build_ns)
            totals.interval_build.record(build_ns)
            totals.check.record(check_ns)
        # A backend that answers without suspending would otherwise starve the monitor.
        await asyncio.sleep(0)


# --- the whole run ----------------------------------------------------------------------


async def _monitor(
    config: LoadTestConfig, phase: _Phase, totals: _Totals, rss: PeakRss, run_began: float, began: float,
    deadline: float | None, timeline: list[TimelinePoint], on_progress: Callable[[Progress], None] | None,
    done: asyncio.Event, intervals: list[tuple[float, float, int]], before: _Counts,
) -> None:
    """Every interval, on a fixed grid from the phase's start: sample RSS, add a timeline point, show progress.

    A beat that comes less than half an interval after the previous one (the loop was
    busy and the beats bunched up) is folded into the next, so that no point's rate is a
    backlog divided by a sliver of time.
    """
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
        rss_mb = rss.sample() / 2**20
        point = TimelinePoint(
            t_s=round(now - run_began, 3),
            snapshots_per_s=round((snaps - last_snap) / dt, 1),
            inferences_per_s=round((totals.inferences - last_inf) / dt, 1),
            build_p50_ms=round(totals.interval_build.percentile_ms(50), 4),
            round_trip_p50_ms=round(totals.interval_rt.percentile_ms(50), 4),
            rss_mb=round(rss_mb, 1),
            max_context_chars=phase.memory.max_context_chars,
            concurrency=phase.concurrency,
        )
        if not done.is_set() and (deadline is None or now <= deadline + _LATE_S):
            timeline.append(point)  # an interval that ends after the phase's end is not a measurement
            intervals.append((last_t - began, now - began, totals.rt_snapshots - last_rt))
        totals.interval_build, totals.interval_rt = Histogram(), Histogram()
        last_t, last_snap, last_inf, last_rt = now, snaps, totals.inferences, totals.rt_snapshots
        if on_progress is not None:
            on_progress(Progress(
                elapsed_s=now - began, planned_s=config.duration_s, requests=config.requests,
                snapshots=before.snapshots + snaps, snapshots_per_s=point.snapshots_per_s,
                inferences=before.inferences + totals.inferences, inferences_per_s=point.inferences_per_s,
                violations=before.violations + totals.violations, over_budget=before.over_budget + totals.over_budget,
                fallbacks=before.fallbacks + totals.fallbacks, rss_mb=rss_mb, phase=phase.label,
            ))


def _rebin_sweep(
    points: list[TimelinePoint], intervals: list[tuple[float, float, int]], marks: list[tuple[float, int, Histogram]]
) -> list[TimelinePoint]:
    """The phase's points with the sweep's figures put in the intervals the processes measured them in."""
    rebinned = []
    for point, (start, end, rt_snapshots) in zip(points, intervals, strict=True):
        builds = Histogram()
        snapshots = rt_snapshots
        for t, count, histogram in marks:
            if start < t <= end:
                snapshots += count
                builds.merge(histogram)
        rebinned.append(msgspec.structs.replace(
            point, snapshots_per_s=round(snapshots / (end - start), 1),
            build_p50_ms=round(builds.percentile_ms(50), 4),
        ))
    return rebinned


class _Counts(msgspec.Struct, frozen=True, kw_only=True):
    """The run's counts before a phase: the live line's counts (and the metrics) never go back."""

    snapshots: int = 0
    inferences: int = 0
    violations: int = 0
    over_budget: int = 0
    fallbacks: int = 0

    def plus(self, t: _Totals) -> _Counts:
        return _Counts(
            snapshots=self.snapshots + t.sweep_snapshots + t.rt_snapshots, inferences=self.inferences + t.inferences,
            violations=self.violations + t.violations, over_budget=self.over_budget + t.over_budget,
            fallbacks=self.fallbacks + t.fallbacks,
        )


class _PhaseOutcome(msgspec.Struct, frozen=True, kw_only=True):
    elapsed_s: float
    round_trip_s: float
    sweep_s: float


async def _run_phase(
    config: LoadTestConfig, phase: _Phase, builder: Builder, checker: Checker, infer: Infer | None,
    states: list[NpcState], totals: _Totals, rss: PeakRss, run_began: float | None,
    timeline: list[TimelinePoint], on_progress: Callable[[Progress], None] | None, before: _Counts,
) -> tuple[_PhaseOutcome, float]:
    """Run one phase into `totals`; returns its times and when it began (the run's start for the first)."""
    rounds = phase.concurrency > 0
    sweep_quota = config.requests if not rounds else None
    async with contextlib.AsyncExitStack() as stack:
        sweep = await stack.enter_async_context(_open_sweep(config, phase.memory, builder, checker, sweep_quota)) \
            if config.processes else None
        if sweep is not None:
            await sweep.wait_ready()
        rss.sample()
        began = time.perf_counter()
        run_began = began if run_began is None else run_began
        deadline = began + config.duration_s if config.duration_s is not None else None
        done = asyncio.Event()
        rt_elapsed = 0.0
        points: list[TimelinePoint] = []
        intervals: list[tuple[float, float, int]] = []
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_monitor(
                config, phase, totals, rss, run_began, began, deadline, points, on_progress, done, intervals, before
            ))
            if sweep is not None:
                sweep.start()
                tg.create_task(sweep.pump(totals))
            if rounds and infer is not None:
                budget = _Budget(deadline, config.requests)
                async with asyncio.TaskGroup() as requesters:
                    for worker in range(phase.concurrency):
                        requesters.create_task(
                            _requester(worker, config, phase, builder, checker, infer, states, budget, totals)
                        )
                rt_elapsed = time.perf_counter() - began
            elif deadline is not None:
                await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            if sweep is not None and sweep_quota is None:
                sweep.stop()
            done.set()
        elapsed = time.perf_counter() - began
        rss.sample()
    timeline.extend(_rebin_sweep(points, intervals, totals.sweep_marks) if sweep is not None else points)
    outcome = _PhaseOutcome(
        elapsed_s=elapsed, round_trip_s=rt_elapsed, sweep_s=sweep.active_s if sweep is not None else 0.0
    )
    return outcome, run_began


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
    totals = _Totals()
    rss = PeakRss()
    timeline: list[TimelinePoint] = []
    levels, memories = config.concurrencies, config.memories
    settings = InferenceSettings(
        backend=config.backend, backend_options=config.backend_options, latency_ms=config.latency_ms,
        concurrency=max(levels),
        broker=config.broker, seed=config.seed,
    )
    budgets: list[BudgetResult] = []
    sweep_points: list[SweepPoint] = []
    elapsed = rt_elapsed = sweep_s = 0.0
    run_began: float | None = None
    counted = _Counts()
    count = len(levels) * len(memories)
    async with contextlib.AsyncExitStack() as stack:
        infer = await stack.enter_async_context(inference(settings)) if max(levels) else None
        states = _round_trip_states(config) if infer is not None else []
        for memory in memories:
            for state in states:
                builder(state, "", memory)  # as in the sweep: warm the per-state caches outside the timing
            budget_totals = _Totals()
            budget_sweep_s = budget_rt_s = 0.0
            rates: list[tuple[int, float]] = []
            for level in levels:
                number = len(budgets) * len(levels) + len(rates) + 1
                phase = _Phase(
                    memory=memory, concurrency=level,
                    label=f"{_budget_label(memory)}, concurrency {level}" + (f" [{number}/{count}]" if count > 1
                                                                            else ""),
                )
                phase_totals = _Totals()
                outcome, run_began = await _run_phase(
                    config, phase, builder, checker, infer, states, phase_totals, rss, run_began, timeline,
                    on_progress, counted,
                )
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
    )
