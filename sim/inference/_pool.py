"""The inference pool: bounded slots, a priority queue of waiters, a transport behind.

Backpressure: at most `config.slots` requests are in flight; an agent calling `infer` on a
full pool waits for a slot. Waiters are served by (priority, arrival), so a player waiting
for an answer goes before ambient chatter; the only queue is the waiting coroutines
themselves, so nothing queues without bound behind the agents' backs.

Behind the slots is one `Dispatch` (`sim.inference._dispatch`): serving on a backend in
this process, in a worker process of its own (`sim.inference._local`), or the MQTT link to
remote workers (`sim.inference._link`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from sim.audit import Attempt, AuditRecord
from sim.errors import BackendTimeoutError, CircuitOpenError, InferenceError
from sim.inference._counted import KeptCounts
from sim.inference._counters import Counters, LogOnce, PoolStatistics
from sim.inference._dispatch import Dispatch, fallback_result
from sim.inference._link import open_mqtt_dispatch
from sim.inference._local import open_local_dispatch
from sim.inference._pool_config import PoolConfig
from sim.inference._serve import serve
from sim.inference.backends import Backend, Reply, Tokenizer, open_backend
from sim.memory import WorkingMemory
from sim.output import FactGuard, load_fact_guard
from sim.wire.attempt import ServedBy, Usage
from sim.wire.inference import InferenceRequest, InferenceResult

__all__ = ["Pool", "Slots", "open_pool"]

log = logging.getLogger(__name__)


class Slots:
    """A counting gate whose waiters are served lowest priority value first, then FIFO.

    A released slot is handed straight to the next waiter, so a newcomer cannot overtake
    the queue. The counters it keeps are the pool's.
    """

    def __init__(self, capacity: int, counters: Counters) -> None:
        self.capacity = capacity
        self._counters = counters
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrival = itertools.count()

    def _take(self) -> None:
        c = self._counters
        c.in_flight += 1
        c.in_flight_peak = max(c.in_flight_peak, c.in_flight)

    async def acquire(self, priority: int) -> None:
        if self._counters.in_flight < self.capacity and not self._waiters:
            self._take()
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (int(priority), next(self._arrival), future)
        heapq.heappush(self._waiters, entry)
        self._counters.waiting += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot was handed over just as we were cancelled
            elif entry in self._waiters:  # a release may have dropped it already, as a waiter gone
                self._waiters.remove(entry)
                heapq.heapify(self._waiters)
            raise
        finally:
            self._counters.waiting -= 1

    def release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)  # the slot passes over: in_flight is unchanged
                return
        self._counters.in_flight -= 1


class Pool:
    """Use through `open_pool`; `infer` is the one operation."""

    def __init__(self, config: PoolConfig, dispatch: Dispatch, counters: Counters) -> None:
        self.config = config
        self._dispatch = dispatch
        self._counters = counters
        self._slots = Slots(config.slots, counters)

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        """Wait for a slot, then have a worker answer; a fallback result on any backend failure."""
        self._counters.requests += 1
        started = time.perf_counter()
        await self._slots.acquire(request.priority)
        try:
            admitted = time.perf_counter()
            result = await self._dispatch(request)
        finally:
            self._slots.release()
        done = time.perf_counter()
        self._counters.count_result(result)
        timings = {
            "queue_ms": (admitted - started) * 1000, "service_ms": (done - admitted) * 1000,
            "total_ms": (done - started) * 1000,
        }
        return msgspec.structs.replace(result, timings={**result.timings, **timings})

    def statistics(self) -> PoolStatistics:
        return self._counters.snapshot()


Recorded = Callable[[InferenceRequest], AuditRecord | None]
"""The record of a recorded run that answers a request, or None (`open_pool`'s `recorded`)."""


@asynccontextmanager
async def open_pool(
    config: PoolConfig,
    *,
    backend: Backend | None = None,
    fact_guard: FactGuard | None = None,
    recorded: Recorded | None = None,
) -> AsyncIterator[Pool]:
    """Open a pool with in-process workers, a worker process, or one that sends requests to remote workers.

    `backend` serves in-process requests instead of opening `config.backend`, and
    `fact_guard` is the output check's fact guard instead of the one `config.fact_guard`
    names: for embedders and tests that bring their own (either serves in this process,
    whatever `config.transport` says: a worker process cannot take them). `recorded` (in process only)
    answers each request it has a record for with that record's replies
    (`RecordedBackend`: a re-execution, sim.replay); the others go to the backend.
    """
    counters = Counters()
    guard = fact_guard if fact_guard is not None else load_fact_guard(config.fact_guard)
    if config.transport == "mqtt":
        async with open_mqtt_dispatch(config, counters, guard) as dispatch:
            yield Pool(config, dispatch, counters)
        return
    if config.transport == "process" and backend is None and fact_guard is None and recorded is None:
        async with open_local_dispatch(config, counters) as dispatch:
            yield Pool(config, dispatch, counters)
        return
    warn = LogOnce(log)

    def dispatcher(live: Backend) -> Dispatch:
        async def dispatch(request: InferenceRequest) -> InferenceResult:
            record = None if recorded is None else recorded(request)
            served_by: Backend = live if record is None else RecordedBackend(record)
            if record is not None and record.fallback and not record.attempts:
                return fallback_result(request, record.fallback_reason or "backend_error", backend=record.backend,
                                       model=record.model, worker="recorded")
            return await serve(
                request, served_by, time_limit=config.timeout, rules=config.rules,
                counters=counters, worker="inprocess", warn=warn, guard=guard,
            )

        return dispatch

    if backend is not None:
        yield Pool(config, dispatcher(backend), counters)
        return
    async with open_backend(config.backend, config.options, config.concurrency, config.timeout) as opened:
        yield Pool(config, dispatcher(opened), counters)


class RecordedBackend:
    """A backend that gives back one record's attempts, in order (one instance per request).

    A re-execution (`npcsim replay`) asks exactly what the run asked, and `serve` answers it
    again on the recorded replies and failures: output handling judges each reply anew and a
    rejected one is retried with the working memory the re-execution built, so what differs
    from the record is the run's doing, not the model's. More attempts than were made fail
    ("no recorded reply"), and the fallback speaks. A retry's working memory counts with the
    record's server token counts (`tokenizer`).
    """

    def __init__(self, record: AuditRecord) -> None:
        self.name = record.backend
        self.model = record.model
        first = record.attempts[0] if record.attempts else Attempt(prompt="")
        self.prompt_form = first.form
        self.prompt_prefix = first.prefix
        self._params = dict(record.params)
        self._attempts: Iterator[Attempt] = iter(record.attempts)
        self._made = 0
        self._counts = KeptCounts(record.counts)

    def tokenizer(self) -> Tokenizer:
        return self._counts

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None) -> Reply:
        self._made += 1
        attempt = next(self._attempts, None)
        if attempt is None:
            raise InferenceError(f"no recorded reply for attempt {self._made}")
        if attempt.raw_response is not None:
            return Reply(text=attempt.raw_response, model=self.model, params=self._params,
                         usage=attempt.usage or Usage(), served_by=attempt.served_by or ServedBy())
        reason, _, detail = (attempt.problem or "backend_error: no reply").partition(": ")
        if reason == "timeout":
            raise BackendTimeoutError(detail)
        if reason == "circuit_open":
            raise CircuitOpenError(detail)
        raise InferenceError(detail or reason)
