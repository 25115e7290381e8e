"""The sweep: worker processes that build and check snapshots as fast as they can, and the parent's side.

Each of `processes` worker processes (spawned: no fork of a running event loop) generates
its share of the agents locally from the seed (agent i goes to process i % processes),
builds each once before the clock starts (the rendering and token counts of a state are
cached, as in the server's hot state), then builds and checks snapshots of random agents
until told to stop or its quota is met. Building is CPU-bound Python, so only processes
spread it over the cores. A process reports to the parent through a queue of encoded
`sim.loadtest._messages` four times a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import queue
import random
import time
from collections.abc import AsyncIterator
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

import msgspec

from sim.errors import NpcsimError
from sim.loadtest._config import LoadTestConfig
from sim.loadtest._messages import (
    Counted,
    Done,
    Failed,
    Ready,
    SweepCounts,
    SweepMessage,
    decode_message,
    encode_message,
)
from sim.loadtest._snapshot import KEEP_VIOLATIONS, Builder, Checker, build_and_check, violation_records
from sim.loadtest._states import generate_state, pick_input
from sim.loadtest._stats import Histogram, ViolationRecord
from sim.loadtest._totals import Totals
from sim.loadtest._truncation import TruncationTally
from sim.memory import WorkingMemoryConfig

__all__ = ["Sweep", "open_sweep"]

log = logging.getLogger(__name__)

_FLUSH_S = 0.25
_BATCH = 64
_SHUTDOWN_S = 15.0


# --- in each worker process -------------------------------------------------------------


class _SweepJob(msgspec.Struct, frozen=True):
    """What one sweep process is told: its share, the phase's budget, its quota."""

    index: int
    processes: int
    agents: int
    seed: int
    sizing_chars: int
    memory: WorkingMemoryConfig
    quota: int | None


def _sweep_process(
    job: _SweepJob, builder: Builder, checker: Checker, out: Queue[bytes], start: Event, stop: Event
) -> None:
    """One sweep process: generate and render its share, then build and check until told."""
    try:
        _sweep_loop(job, builder, checker, out, start, stop)
    except BaseException as exc:
        out.put(encode_message(Failed(process=job.index, error=f"{type(exc).__name__}: {exc}")))
        raise


def _counts(
    snapshots: int, over: int, nviolations: int, build: Histogram, check: Histogram, tally: TruncationTally,
    found: list[ViolationRecord], active_s: float,
) -> SweepCounts:
    return SweepCounts(
        snapshots=snapshots, over_budget=over, violations=nviolations, found=found, build=build.to_wire(),
        check=check.to_wire(), truncation=tally.to_wire(), active_s=active_s,
    )


def _sweep_loop(
    job: _SweepJob, builder: Builder, checker: Checker, out: Queue[bytes], start: Event, stop: Event
) -> None:
    memory, quota = job.memory, job.quota
    states = [generate_state(job.seed, i, job.sizing_chars) for i in range(job.index, job.agents, job.processes)]
    for state in states:
        builder(state, "", memory)  # warm before the clock: rendering and token counts are cached per state
    out.put(encode_message(Ready(process=job.index)))
    start.wait()
    if stop.is_set():
        nothing = _counts(0, 0, 0, Histogram(), Histogram(), TruncationTally(), [], 0.0)
        out.put(encode_message(Done(process=job.index, counts=nothing)))
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
            wm, violations, build_ns, check_ns = build_and_check(builder, checker, state, said, memory)
            build.record(build_ns)
            check.record(check_ns)
            tally.record(wm.report)
            snapshots += 1
            total += 1
            if wm.report.over_budget:
                over += 1
            if violations:
                nviolations += len(violations)
                if len(found) < KEEP_VIOLATIONS:
                    found.extend(violation_records(state.agent_id, said, violations, "sweep"))
        now = time.perf_counter()
        if now - last_flush >= _FLUSH_S:
            counts = _counts(snapshots, over, nviolations, build, check, tally, found, now - began)
            out.put(encode_message(Counted(process=job.index, counts=counts)))
            snapshots = over = nviolations = 0
            build, check, tally, found = Histogram(), Histogram(), TruncationTally(), []
            last_flush = now
    counts = _counts(snapshots, over, nviolations, build, check, tally, found, time.perf_counter() - began)
    out.put(encode_message(Done(process=job.index, counts=counts)))


# --- in the parent ----------------------------------------------------------------------


class Sweep:
    """The parent's side of the sweep processes: readiness, start, progress, shutdown."""

    def __init__(self, procs: list[SpawnProcess], out: Queue[bytes], start: Event, stop: Event) -> None:
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

    async def _next(self) -> list[SweepMessage]:
        """Every message waiting (at least one, unless 0.1 s pass): a busy event loop must not fall behind."""
        try:
            received = [await asyncio.to_thread(self._out.get, True, 0.1)]
        except queue.Empty:
            for i, proc in enumerate(self._procs):
                if i not in self._done and proc.exitcode is not None:
                    raise NpcsimError(
                        f"sweep process {i} exited with code {proc.exitcode} without a report"
                    ) from None
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                received.append(self._out.get_nowait())
        messages = [decode_message(data) for data in received]
        for message in messages:
            if isinstance(message, Failed):
                raise NpcsimError(f"sweep process {message.process} failed: {message.error}")
        return messages

    async def wait_ready(self) -> None:
        while len(self._ready) < len(self._procs):
            for message in await self._next():
                if isinstance(message, Ready):
                    self._ready.add(message.process)

    def start(self) -> None:
        self._start.set()

    def stop(self) -> None:
        self._stop.set()
        self._start.set()

    async def pump(self, totals: Totals) -> None:
        """Fold the processes' reports into `totals` until every process has said done."""
        while not self.finished:
            for message in await self._next():
                if isinstance(message, Done):
                    self._done.add(message.process)
                if isinstance(message, Counted | Done):
                    self._active[message.process] = message.counts.active_s
                    totals.add_sweep(message.counts)


@contextlib.asynccontextmanager
async def open_sweep(
    config: LoadTestConfig, memory: WorkingMemoryConfig, builder: Builder, checker: Checker, quota: int | None
) -> AsyncIterator[Sweep]:
    """Start the sweep processes (spawned: no fork of a running event loop); stop them on exit."""
    ctx = multiprocessing.get_context("spawn")
    out: Queue[bytes] = ctx.Queue()
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
    sweep = Sweep(procs, out, start, stop)
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
