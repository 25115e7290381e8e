"""The one place the load test touches the inference pool (sim.inference, issue 5).

The round trip is `await infer(memory, tick)`; this module opens the pool the options ask
for and adapts it to that one call:

* in-process (default): the pool runs its worker in this process;
* `--broker URL`: end to end over MQTT. The pool publishes requests on
  `npcsim/loadtest/infer/req`; one worker in this process serves them through the shared
  subscription, and any `npcsim worker` started on the same broker for run `loadtest`
  joins it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sim.errors import BrokerError, ConfigError
from sim.memory import WorkingMemory

__all__ = ["FALLBACK_LINES", "RUN_ID", "Infer", "InferenceSettings", "open_inference"]

# (memory, tick) -> whether the answer was a fallback line.
Infer = Callable[[WorkingMemory, int], Awaitable[bool]]
FALLBACK_LINES = ("Hm.", "Let me think on that.", "Not now, friend.")
RUN_ID = "loadtest"
_DEADLINE_S = 30.0
_WORKER_READY_S = 10.0


class InferenceSettings:
    """What the pool is opened with; plain values so tests can build it by hand."""

    def __init__(self, *, backend: str, latency_ms: float, concurrency: int, broker: str | None, seed: int) -> None:
        if latency_ms and backend != "scripted":
            raise ConfigError(f"--latency-ms applies to the scripted backend only, not to backend {backend!r}")
        self.backend = backend
        self.latency_ms = latency_ms
        self.concurrency = concurrency
        self.broker = broker
        self.seed = seed

    @property
    def options(self) -> dict[str, Any]:
        return {"delay_ms": self.latency_ms} if self.latency_ms else {}


@contextlib.asynccontextmanager
async def open_inference(settings: InferenceSettings) -> AsyncIterator[Infer]:
    """Open the inference pool for the run and yield the round trip's one await."""
    from sim.inference import InferenceRequest, PoolConfig, Priority, RemoteWorker, WorkerConfig, open_pool

    slots = max(1, settings.concurrency)
    async with contextlib.AsyncExitStack() as stack:
        if settings.broker is None:
            pool_config = PoolConfig(backend=settings.backend, options=settings.options, concurrency=slots,
                                     max_in_flight=slots, run_id=RUN_ID)
        else:
            worker = RemoteWorker(WorkerConfig(broker=settings.broker, run_id=RUN_ID, backend=settings.backend,
                                               options=settings.options, concurrency=slots, name="loadtest-local"))
            workers = await stack.enter_async_context(asyncio.TaskGroup())
            serving = workers.create_task(worker.run())
            stack.callback(serving.cancel)  # runs after the pool below has closed
            try:
                async with asyncio.timeout(_WORKER_READY_S):
                    await worker.ready.wait()
            except TimeoutError:
                raise BrokerError(
                    f"--broker {settings.broker}: the local worker did not subscribe within {_WORKER_READY_S:.0f} s"
                ) from None
            pool_config = PoolConfig(backend=settings.backend, options=settings.options, concurrency=slots,
                                     max_in_flight=slots, transport="mqtt", broker=settings.broker, run_id=RUN_ID)
        pool = await stack.enter_async_context(open_pool(pool_config))

        async def infer(memory: WorkingMemory, tick: int) -> bool:
            request = InferenceRequest(
                id=uuid.uuid4().hex,
                run_id=RUN_ID,
                agent_id=memory.agent_id,
                tick=tick,
                memory=memory,
                priority=Priority.PLAYER,
                deadline=time.time() + _DEADLINE_S,
                fallback_lines=FALLBACK_LINES,
                seed=settings.seed,
                shard="0",
            )
            result = await pool.infer(request)
            return bool(result.fallback)

        yield infer
