"""The load loop: a build-and-check sweep over the cores, and a round trip through the pool.

Two figures, measured at the same time and labelled apart:

* the **sweep**: `processes` worker processes (default: one per core), each generating its
  share of the agents locally from the seed (agent i goes to process i % processes),
  building each once before the clock starts (a state caches its rendered items and
  their token counts, as the server's hot state does), then building and checking snapshots of
  random agents as fast as it can. Building is CPU-bound Python, so only processes spread
  it over the cores. Each process ships counts and latency-histogram deltas to the parent
  four times a second. This gives snapshots/s and the build and check latencies.
* the **round trip**: `concurrency` asyncio tasks in this process, each looping: pick an
  agent, build, check, then `await infer(...)` through the inference pool. This gives
  inferences/s and the round-trip latency (build + check + inference).

Every snapshot of either part goes through the independent checker (`sim.checker`).
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
from sim.loadtest._stats import Histogram, LoadTestResult, PeakRss, TimelinePoint, ViolationRecord
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


def default_processes() -> int:
    """One sweep process per core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class LoadTestConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One load test. Exactly one of `duration_s` and `requests` ends it.

    `requests` counts round trips (or, with `concurrency=0`, snapshots of the sweep).
    `processes=0` turns the sweep off; `concurrency=0` turns the round trip off.
    """

    agents: int = 1000
    duration_s: float | None = 10.0
    requests: int | None = None
    concurrency: int = 64
    processes: int = msgspec.field(default_factory=default_processes)
    memory: WorkingMemoryConfig = msgspec.field(default_factory=WorkingMemoryConfig)
    backend: str = "scripted"
    backend_options: dict[str, Any] = msgspec.field(default_factory=dict)
    latency_ms: float = 0.0
    broker: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.agents < 1:
            raise ConfigError(f"agents must be >= 1, got {self.agents!r}")
        if (self.duration_s is None) == (self.requests is None):
            raise ConfigError("give exactly one of duration_s and requests")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ConfigError(f"duration_s must be > 0, got {self.duration_s!r}")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"requests must be >= 1, got {self.requests!r}")
        if self.concurrency < 0 or self.processes < 0:
            raise ConfigError(f"concurrency and processes must be >= 0, got {self.concurrency}, {self.processes}")
        if self.concurrency == 0 and self.processes == 0:
            raise ConfigError("concurrency and processes are both 0: nothing would run")
        if self.latency_ms < 0:
            raise ConfigError(f"latency_ms must be >= 0, got {self.latency_ms!r}")


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """What the live display shows, taken every interval."""

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


class _Totals:
    """Everything counted so far, from both parts; interval histograms feed the timeline."""

    def __init__(self) -> None:
        self.sweep_snapshots = 0
        self.rt_snapshots = 0
        self.inferences = 0
        self.violations = 0
        self.over_budget = 0
        self.fallbacks = 0
        self.first_violations: list[ViolationRecord] = []
        self.build = Histogram()
        self.check = Histogram()
        self.infer = Histogram()
        self.round_trip = Histogram()
        self.interval_build = Histogram()
        self.interval_rt = Histogram()
        self.sweep_active_s = 0.0

    def add_violations(self, records: list[ViolationRecord], count: int) -> None:
        self.violations += count
        room = _KEEP_VIOLATIONS - len(self.first_violations)
        if room > 0:
            self.first_violations.extend(records[:room])


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


def _sweep_process(
    index: int,
    config: LoadTestConfig,
    builder: Builder,
    checker: Checker,
    out: Any,
    start: Any,
    stop: Any,
    quota: int | None,
) -> None:
    """One sweep process: generate and render its share, then build and check until told."""
    try:
        _sweep_loop(index, config, builder, checker, out, start, stop, quota)
    except BaseException as exc:
        out.put(("error", index, f"{type(exc).__name__}: {exc}"))
        raise


def _sweep_loop(
    index: int, config: LoadTestConfig, builder: Builder, checker: Checker, out: Any, start: Any, stop: Any,
    quota: int | None,
) -> None:
    memory = config.memory
    states = [
        generate_state(config.seed, i, memory.max_context_chars)
        for i in range(index, config.agents, config.processes)
    ]
    for state in states:
        builder(state, "", memory)  # warm before the clock: rendering and token counts are cached per state
    out.put(("ready", index, None))
    start.wait()
    if stop.is_set():
        out.put(("done", index, _delta(0, 0, 0, Histogram(), Histogram(), [], 0.0)))
        return
    rng = random.Random(f"npcsim-loadtest:{config.seed}:sweep:{index}")
    began = last_flush = time.perf_counter()
    n = len(states)
    total = snapshots = over = nviolations = 0
    build, check = Histogram(), Histogram()
    found: list[ViolationRecord] = []
    while not stop.is_set() and (quota is None or total < quota):
        for _ in range(_BATCH if quota is None else min(_BATCH, quota - total)):
            state = states[rng.randrange(n)]
            said = pick_input(rng)
            wm, violations, build_ns, check_ns = _build_and_check(builder, checker, state, said, memory)
            build.record(build_ns)
            check.record(check_ns)
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
            out.put(("progress", index, _delta(snapshots, over, nviolations, build, check, found, now - began)))
            snapshots = over = nviolations = 0
            build, check, found = Histogram(), Histogram(), []
            last_flush = now
    out.put(("done", index, _delta(snapshots, over, nviolations, build, check, found, time.perf_counter() - began)))


def _delta(
    snapshots: int, over: int, nviolations: int, build: Histogram, check: Histogram,
    found: list[ViolationRecord], active_s: float,
) -> dict[str, Any]:
    return {
        "snapshots": snapshots,
        "over_budget": over,
        "violations": nviolations,
        "found": found,
        "build": build.to_wire(),
        "check": check.to_wire(),
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

    async def _next(self) -> tuple[str, int, Any] | None:
        try:
            message: tuple[str, int, Any] = await asyncio.to_thread(self._out.get, True, 0.1)
        except queue.Empty:
            for i, proc in enumerate(self._procs):
                if i not in self._done and proc.exitcode is not None:
                    raise NpcsimError(
                        f"sweep process {i} exited with code {proc.exitcode} without a report"
                    ) from None
            return None
        if message[0] == "error":
            raise NpcsimError(f"sweep process {message[1]} failed: {message[2]}")
        return message

    async def wait_ready(self) -> None:
        while len(self._ready) < len(self._procs):
            message = await self._next()
            if message is not None and message[0] == "ready":
                self._ready.add(message[1])

    def start(self) -> None:
        self._start.set()

    def stop(self) -> None:
        self._stop.set()
        self._start.set()

    async def pump(self, totals: _Totals) -> None:
        """Fold the processes' deltas into `totals` until every process has said done."""
        while not self.finished:
            message = await self._next()
            if message is None:
                continue
            kind, index, delta = message
            if kind == "done":
                self._done.add(index)
            self._active[index] = delta["active_s"]
            totals.sweep_snapshots += delta["snapshots"]
            totals.over_budget += delta["over_budget"]
            totals.add_violations(delta["found"], delta["violations"])
            build = Histogram.from_wire(delta["build"])
            totals.build.merge(build)
            totals.interval_build.merge(build)
            totals.check.merge(Histogram.from_wire(delta["check"]))


@contextlib.asynccontextmanager
async def _open_sweep(
    config: LoadTestConfig, builder: Builder, checker: Checker, quota: int | None
) -> AsyncIterator[_Sweep]:
    """Start the sweep processes (spawned: no fork of a running event loop); stop them on exit."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start, stop = ctx.Event(), ctx.Event()
    shares = [None] * config.processes if quota is None else [
        quota // config.processes + (1 if i < quota % config.processes else 0) for i in range(config.processes)
    ]
    procs = [
        ctx.Process(
            target=_sweep_process,
            args=(i, config, builder, checker, out, start, stop, shares[i]),
            name=f"npcsim-loadtest-sweep-{i}",
            daemon=True,
        )
        for i in range(config.processes)
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
        """The next request's tick, or None when the run is over."""
        if self._deadline is not None and time.perf_counter() >= self._deadline:
            return None
        if self._left is not None:
            if self._left <= 0:
                return None
            self._left -= 1
        self.tick += 1
        return self.tick


def _round_trip_states(config: LoadTestConfig, builder: Builder) -> list[NpcState]:
    """Every agent, generated and warmed before the clock starts (while the sweep does its share)."""
    states = [generate_state(config.seed, i, config.memory.max_context_chars) for i in range(config.agents)]
    for state in states:
        builder(state, "", config.memory)  # as in the sweep: warm the per-state caches outside the timing
    return states


async def _requester(
    worker: int, config: LoadTestConfig, builder: Builder, checker: Checker, infer: Infer,
    states: list[NpcState], budget: _Budget, totals: _Totals,
) -> None:
    rng = random.Random(f"npcsim-loadtest:{config.seed}:round-trip:{worker}")
    memory = config.memory
    clock = time.perf_counter_ns
    while (tick := budget.take()) is not None:
        state = states[rng.randrange(config.agents)]
        said = pick_input(rng)
        t0 = clock()
        wm, violations, build_ns, check_ns = _build_and_check(builder, checker, state, said, memory)
        t2 = clock()
        fallback = await infer(wm, tick)
        t3 = clock()
        totals.rt_snapshots += 1
        totals.inferences += 1
        totals.fallbacks += fallback
        if wm.report.over_budget:
            totals.over_budget += 1
        if violations:
            totals.add_violations(_records(state.agent_id, said, violations, "round_trip"), len(violations))
        totals.infer.record(t3 - t2)
        totals.round_trip.record(t3 - t0)
        totals.interval_rt.record(t3 - t0)
        if not config.processes:  # without a sweep, the round trip's builds are the build figures
            totals.build.record(build_ns)
            totals.interval_build.record(build_ns)
            totals.check.record(check_ns)


# --- the whole run ----------------------------------------------------------------------


async def _monitor(
    config: LoadTestConfig, totals: _Totals, rss: PeakRss, began: float, timeline: list[TimelinePoint],
    on_progress: Callable[[Progress], None] | None, done: asyncio.Event,
) -> None:
    """Every interval: sample RSS, add a timeline point, update the display."""
    last_t, last_snap, last_inf = began, 0, 0
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), _TIMELINE_S)
        now = time.perf_counter()
        dt = max(now - last_t, 1e-9)
        snaps = totals.sweep_snapshots + totals.rt_snapshots
        rss_mb = rss.sample() / 2**20
        point = TimelinePoint(
            t_s=round(now - began, 3),
            snapshots_per_s=round((snaps - last_snap) / dt, 1),
            inferences_per_s=round((totals.inferences - last_inf) / dt, 1),
            build_p50_ms=round(totals.interval_build.percentile_ms(50), 4),
            round_trip_p50_ms=round(totals.interval_rt.percentile_ms(50), 4),
            rss_mb=round(rss_mb, 1),
        )
        if not done.is_set():
            timeline.append(point)
        totals.interval_build, totals.interval_rt = Histogram(), Histogram()
        last_t, last_snap, last_inf = now, snaps, totals.inferences
        if on_progress is not None:
            on_progress(Progress(
                elapsed_s=now - began, planned_s=config.duration_s, requests=config.requests, snapshots=snaps,
                snapshots_per_s=point.snapshots_per_s, inferences=totals.inferences,
                inferences_per_s=point.inferences_per_s, violations=totals.violations,
                over_budget=totals.over_budget, fallbacks=totals.fallbacks, rss_mb=rss_mb,
            ))


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
    sweep_quota = config.requests if config.concurrency == 0 else None
    settings = InferenceSettings(
        backend=config.backend, backend_options=config.backend_options, latency_ms=config.latency_ms,
        concurrency=config.concurrency,
        broker=config.broker, seed=config.seed,
    )
    async with contextlib.AsyncExitStack() as stack:
        sweep = await stack.enter_async_context(_open_sweep(config, builder, checker, sweep_quota)) \
            if config.processes else None
        infer = await stack.enter_async_context(inference(settings)) if config.concurrency else None
        states = _round_trip_states(config, builder) if infer is not None else []
        if sweep is not None:
            await sweep.wait_ready()
        rss.sample()
        began = time.perf_counter()
        deadline = began + config.duration_s if config.duration_s is not None else None
        done = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_monitor(config, totals, rss, began, timeline, on_progress, done))
            if sweep is not None:
                sweep.start()
                tg.create_task(sweep.pump(totals))
            if infer is not None:
                budget = _Budget(deadline, config.requests)
                async with asyncio.TaskGroup() as requesters:
                    for worker in range(config.concurrency):
                        requesters.create_task(
                            _requester(worker, config, builder, checker, infer, states, budget, totals)
                        )
                rt_elapsed = time.perf_counter() - began
            elif deadline is not None:
                await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            if sweep is not None and sweep_quota is None:
                sweep.stop()
            done.set()
        elapsed = time.perf_counter() - began
        rss.sample()
    if infer is None:
        rt_elapsed = elapsed
    sweep_s = sweep.active_s if sweep is not None else 0.0
    sweep_rate = totals.sweep_snapshots / sweep_s if sweep_s > 0 else totals.rt_snapshots / rt_elapsed
    return LoadTestResult(
        agents=config.agents,
        seed=config.seed,
        duration_s=round(elapsed, 3),
        processes=config.processes,
        concurrency=config.concurrency,
        backend=config.backend,
        latency_ms=config.latency_ms,
        broker=redact(config.broker) if config.broker else None,
        max_context_chars=config.memory.max_context_chars,
        max_context_tokens=config.memory.max_context_tokens,
        snapshots=totals.sweep_snapshots + totals.rt_snapshots,
        sweep_snapshots=totals.sweep_snapshots,
        snapshots_per_s=round(sweep_rate, 1),
        all_snapshots_per_s=round((totals.sweep_snapshots + totals.rt_snapshots) / elapsed, 1),
        inferences=totals.inferences,
        inferences_per_s=round(totals.inferences / rt_elapsed, 1) if infer is not None else 0.0,
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
    )
