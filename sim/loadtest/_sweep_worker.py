"""A sweep process (`sim.loadtest._sweep`): `python -m sim.loadtest._sweep_worker`.

Given its `SweepSetup` it generates its share of the agents locally from the seed (agent i
goes to process i % processes) and builds each once (the rendering and token counts of a
state are cached, as in the server's hot state), says `Ready`, waits for `Start`, then
builds and checks snapshots of random agents until `Stop` (or the end of its input) or
until its quota is met, with a `Counted` about four times a second and a `Done` at the end.
Building is CPU-bound Python, so only processes spread it over the cores; the orders are
read between two batches.
"""

from __future__ import annotations

import asyncio
import pickle
import random
import sys
import time

from sim.helper import FrameWriter, helper_main, read_frame
from sim.loadtest._messages import (
    Counted,
    Done,
    Failed,
    Ready,
    Start,
    SweepCounts,
    SweepJob,
    decode_order,
    decode_setup,
    encode_message,
)
from sim.loadtest._snapshot import KEEP_VIOLATIONS, Builder, Checker, build_and_check, violation_records
from sim.loadtest._states import generate_state, pick_input
from sim.loadtest._stats import Histogram, ViolationRecord
from sim.loadtest._truncation import TruncationTally
from sim.wire.local import Hello, encode

_FLUSH_S = 0.25
_BATCH = 64


class _Orders:
    """The parent's orders as they come: started, and stopped (by `Stop` or the end of the input)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()

    async def read(self, reader: asyncio.StreamReader) -> None:
        while (body := await read_frame(reader)) is not None:
            (self.started if isinstance(decode_order(body), Start) else self.stopped).set()
        self.stopped.set()


def _counts(
    snapshots: int, over: int, nviolations: int, build: Histogram, check: Histogram, tally: TruncationTally,
    found: list[ViolationRecord], active_s: float,
) -> SweepCounts:
    return SweepCounts(
        snapshots=snapshots, over_budget=over, violations=nviolations, found=found, build=build.to_wire(),
        check=check.to_wire(), truncation=tally.to_wire(), active_s=active_s,
    )


async def _sweep_loop(job: SweepJob, builder: Builder, checker: Checker, orders: _Orders, write: FrameWriter) -> None:
    memory, quota = job.memory, job.quota
    states = [generate_state(job.seed, i, job.sizing_chars) for i in range(job.index, job.agents, job.processes)]
    for state in states:
        builder(state, "", memory)  # warm before the clock: rendering and token counts are cached per state
    write(encode_message(Ready(process=job.index)))
    started, stopped = asyncio.create_task(orders.started.wait()), asyncio.create_task(orders.stopped.wait())
    await asyncio.wait([started, stopped], return_when=asyncio.FIRST_COMPLETED)
    started.cancel()
    stopped.cancel()
    if orders.stopped.is_set():
        nothing = _counts(0, 0, 0, Histogram(), Histogram(), TruncationTally(), [], 0.0)
        write(encode_message(Done(process=job.index, counts=nothing)))
        return
    rng = random.Random(f"npcsim-loadtest:{job.seed}:sweep:{job.index}")
    began = last_flush = time.perf_counter()
    n = len(states)
    total = snapshots = over = nviolations = 0
    build, check, tally = Histogram(), Histogram(), TruncationTally()
    found: list[ViolationRecord] = []
    while not orders.stopped.is_set() and (quota is None or total < quota):
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
            write(encode_message(Counted(process=job.index, counts=counts)))
            snapshots = over = nviolations = 0
            build, check, tally, found = Histogram(), Histogram(), TruncationTally(), []
            last_flush = now
        await asyncio.sleep(0)  # a yield: the parent's orders are read, the reports written
    counts = _counts(snapshots, over, nviolations, build, check, tally, found, time.perf_counter() - began)
    write(encode_message(Done(process=job.index, counts=counts)))


async def _sweep(body: bytes, reader: asyncio.StreamReader, write: FrameWriter) -> str | None:
    """One sweep process: its share generated and warmed, then built and checked until told."""
    setup = decode_setup(body)
    sys.path[:] = setup.path
    write(encode(Hello()))
    orders = _Orders()
    reading = asyncio.create_task(orders.read(reader))
    try:
        builder, checker = pickle.loads(setup.functions)  # from its parent: the same program
        await _sweep_loop(setup.job, builder, checker, orders, write)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it with this process's number
        write(encode_message(Failed(process=setup.job.index, error=f"{type(exc).__name__}: {exc}")))
    finally:
        reading.cancel()
    return None


if __name__ == "__main__":
    helper_main(_sweep)
