"""The one place the load test touches the inference pool (sim.inference).

The round trip is `await infer(memory, tick, output)`; this module opens the pool the options ask
for and adapts it to that one call:

* in-process (default): the pool runs its worker in this process;
* `--broker URL`: end to end over MQTT. The pool publishes requests on
  `npcsim/loadtest/infer/req`; a worker in a helper process of its own
  (`sim.loadtest._mqtt_worker`, as a remote worker would be) serves them through the shared
  subscription, and any `npcsim worker` started on the same broker for run `loadtest`
  joins it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import msgspec

from sim.audit import Attempt
from sim.errors import BrokerError, ConfigError
from sim.helper import Helper
from sim.memory import WorkingMemory
from sim.mqtt import BrokerAddress
from sim.output import OutputPolicy

__all__ = ["FALLBACK_LINES", "RUN_ID", "Answer", "Infer", "InferenceSettings", "open_inference"]

log = logging.getLogger(__name__)



class Answer(NamedTuple):
    """What the round trip keeps of a result: fallback or not, the tokens the backend reported
    for the reply (`cached_tokens`: of its prompt tokens, those the server reused), the
    attempts (their gates' verdicts, under an output policy), and each model server's
    adaptive limit as the pool heard of it with this result (none for a backend without)."""

    fallback: bool
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    attempts: tuple[Attempt, ...] = ()
    server_limits: Mapping[str, int] = MappingProxyType({})


Infer = Callable[[WorkingMemory, int, OutputPolicy | None], Awaitable[Answer]]
FALLBACK_LINES = ("Hm.", "Let me think on that.", "Not now, friend.")
RUN_ID = "loadtest"
_DEADLINE_S = 30.0
_WORKER_READY_S = 10.0
_WORKER_STOP_S = 5.0


class InferenceSettings:
    """What the pool is opened with; plain values so tests can build it by hand."""

    def __init__(
        self,
        *,
        backend: str,
        latency_ms: float,
        concurrency: int,
        broker: str | None,
        seed: int,
        backend_options: dict[str, Any] | None = None,
    ) -> None:
        if latency_ms and backend != "scripted":
            raise ConfigError(f"--latency-ms applies to the scripted backend only, not to backend {backend!r}")
        self.backend = backend
        self.backend_options = dict(backend_options or {})
        self.latency_ms = latency_ms
        self.concurrency = concurrency
        self.broker = broker
        self.seed = seed

    @property
    def options(self) -> dict[str, Any]:
        return {**self.backend_options, "delay_ms": self.latency_ms} if self.latency_ms else self.backend_options


@contextlib.asynccontextmanager
async def open_inference(settings: InferenceSettings) -> AsyncIterator[Infer]:
    """Open the inference pool for the run and yield the round trip's one await."""
    from sim.inference import InferenceRequest, PoolConfig, Priority, WorkerConfig, open_pool

    slots = max(1, settings.concurrency)
    async with contextlib.AsyncExitStack() as stack:
        if settings.broker is None:
            pool_config = PoolConfig(backend=settings.backend, options=settings.options, concurrency=slots,
                                     max_in_flight=slots, run_id=RUN_ID)
        else:
            # One login (URL or NPCSIM_MQTT_*) serves both sides: it needs the shard's and the worker's rights.
            broker = BrokerAddress.parse(settings.broker)
            await stack.enter_async_context(_worker_process(WorkerConfig(
                broker=broker, run_id=RUN_ID, backend=settings.backend, options=settings.options,
                concurrency=slots, name="loadtest-local",
            )))
            pool_config = PoolConfig(backend=settings.backend, options=settings.options, concurrency=slots,
                                     max_in_flight=slots, transport="mqtt", broker=broker, run_id=RUN_ID)
        pool = await stack.enter_async_context(open_pool(pool_config))

        async def infer(memory: WorkingMemory, tick: int, output: OutputPolicy | None) -> Answer:
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
                output=output,
            )
            result = await pool.infer(request)
            usage = result.attempts[-1].usage if result.attempts else None
            cached = None if usage is None else usage.cached_tokens
            limits = pool.statistics().server_limits  # all workers' together
            return Answer(bool(result.fallback), result.prompt_tokens, result.tokens, cached, result.attempts, limits)

        yield infer


@contextlib.asynccontextmanager
async def _worker_process(config: Any) -> AsyncIterator[None]:
    """Run one MQTT worker (a `sim.inference.WorkerConfig`) in a helper process until the run ends."""
    config_body = msgspec.msgpack.encode(config)
    try:
        async with asyncio.timeout(_WORKER_READY_S):
            worker = await Helper.start("sim.loadtest._mqtt_worker", config_body, what="local worker")
    except TimeoutError:
        raise BrokerError(
            f"--broker {config.broker.url}: the local worker did not subscribe within {_WORKER_READY_S:.0f} s"
        ) from None
    except ConfigError as exc:
        raise BrokerError(f"--broker {config.broker.url}: {exc}") from None
    try:
        yield
    finally:
        worker.end_input()
        try:
            async with asyncio.timeout(_WORKER_STOP_S):
                await worker.ended()
        except TimeoutError:
            log.warning("the local MQTT worker did not stop within %.0f s: terminating it", _WORKER_STOP_S)
        await worker.abort()
