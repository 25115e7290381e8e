"""The sweep: worker processes that build and check snapshots as fast as they can, and the parent's side.

Each of `processes` worker processes (`sim.loadtest._sweep_worker`, a `sim.helper` process)
generates its share of the agents, warms them, and on `Start` builds and checks snapshots of
random agents until told to stop or its quota is met. Building is CPU-bound Python, so only
processes spread it over the cores. A process reports to the parent in frames of
`sim.loadtest._messages` four times a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import sys
from collections.abc import AsyncIterator

from sim.errors import NpcsimError, single_error
from sim.helper import Helper
from sim.loadtest._messages import (
    Counted,
    Done,
    Failed,
    Ready,
    Start,
    Stop,
    SweepJob,
    SweepMessage,
    SweepSetup,
    decode_message,
    encode_message,
)
from sim.loadtest._plan import LoadTestConfig
from sim.loadtest._snapshot import Builder, Checker
from sim.loadtest._totals import Totals
from sim.memory import WorkingMemoryConfig

__all__ = ["Sweep", "open_sweep"]

log = logging.getLogger(__name__)

_SHUTDOWN_S = 15.0


class Sweep:
    """The parent's side of the sweep processes: readiness, start, progress, shutdown."""

    def __init__(self, processes: list[Helper]) -> None:
        self._processes = processes
        self._done: set[int] = set()
        self._stopped = False
        self._active: dict[int, float] = {}

    @property
    def finished(self) -> bool:
        return len(self._done) == len(self._processes)

    @property
    def active_s(self) -> float:
        """How long the sweep ran: the longest-running process's loop time."""
        return max(self._active.values(), default=0.0)

    async def _next(self, index: int) -> SweepMessage:
        """Process `index`'s next message; NpcsimError when it failed or ended without a report."""
        process = self._processes[index]
        body = await process.read()
        if body is None:
            code = await process.ended()
            raise NpcsimError(f"sweep process {index} exited with code {code} without a report")
        message = decode_message(body)
        if isinstance(message, Failed):
            raise NpcsimError(f"sweep process {message.process} failed: {message.error}")
        return message

    async def wait_ready(self) -> None:
        for index in range(len(self._processes)):
            while not isinstance(await self._next(index), Ready):
                pass

    def start(self) -> None:
        for process in self._processes:
            process.send(encode_message(Start()))

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            for process in self._processes:
                process.send(encode_message(Stop()))

    async def pump(self, totals: Totals) -> None:
        """Fold the processes' reports into `totals` until every process has said done."""

        async def follow(index: int) -> None:
            while index not in self._done:
                message = await self._next(index)
                if isinstance(message, Done):
                    self._done.add(index)
                if isinstance(message, Counted | Done):
                    self._active[message.process] = message.counts.active_s
                    totals.add_sweep(message.counts)

        try:
            async with asyncio.TaskGroup() as group:
                for index in range(len(self._processes)):
                    group.create_task(follow(index))
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None

    async def close(self) -> None:
        """Stop every process: told to, then given `_SHUTDOWN_S` to end before it is killed."""
        self.stop()
        for process in self._processes:
            process.end_input()
        deadline = asyncio.get_running_loop().time() + _SHUTDOWN_S
        for index, process in enumerate(self._processes):
            try:
                async with asyncio.timeout_at(deadline):
                    await process.ended()
            except TimeoutError:
                log.warning("sweep process %d did not stop within %.0f s: terminating it", index, _SHUTDOWN_S)
            await process.abort()


@contextlib.asynccontextmanager
async def open_sweep(
    config: LoadTestConfig, memory: WorkingMemoryConfig, builder: Builder, checker: Checker, quota: int | None
) -> AsyncIterator[Sweep]:
    """Start the sweep processes; stop them on exit."""
    n = config.processes
    shares = [None] * n if quota is None else [quota // n + (1 if i < quota % n else 0) for i in range(n)]
    functions = pickle.dumps((builder, checker))

    started: dict[int, Helper] = {}

    async def start(i: int) -> None:
        job = SweepJob(index=i, processes=n, agents=config.agents, seed=config.seed,
                       sizing_chars=config.sizing_chars, memory=memory, quota=shares[i])
        setup = SweepSetup(job=job, functions=functions, path=list(sys.path))
        started[i] = await Helper.start("sim.loadtest._sweep_worker", encode_message(setup), what=f"sweep {i}")

    try:
        try:
            async with asyncio.TaskGroup() as group:
                for i in range(n):
                    group.create_task(start(i))
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None
    except BaseException:
        for process in started.values():  # one failed, or a stop came: none of them stays
            await process.abort()
        raise
    sweep = Sweep([started[i] for i in range(n)])
    try:
        yield sweep
    finally:
        await sweep.close()
