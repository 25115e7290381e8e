"""The one place the load test touches the inference pool (sim.inference, issue 5).

The round trip is `await infer(memory, tick)`; this module opens the pool the options ask
for (in-process, or over MQTT with `--broker`) and adapts it to that one call.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from sim.memory import WorkingMemory

__all__ = ["FALLBACK_LINES", "Infer", "InferenceSettings", "open_inference"]

# (memory, tick) -> whether the answer was a fallback line.
Infer = Callable[[WorkingMemory, int], Awaitable[bool]]
FALLBACK_LINES = ("Hm.", "Let me think on that.", "Not now, friend.")
_DEADLINE_S = 30.0


class InferenceSettings:
    """What the pool is opened with; plain values so tests can build it by hand."""

    def __init__(self, *, backend: str, latency_ms: float, concurrency: int, broker: str | None, seed: int) -> None:
        self.backend = backend
        self.latency_ms = latency_ms
        self.concurrency = concurrency
        self.broker = broker
        self.seed = seed


@contextlib.asynccontextmanager
async def open_inference(settings: InferenceSettings) -> AsyncIterator[Infer]:
    """Open the inference pool for the run and yield the round trip's one await."""
    from sim.inference import InferenceRequest, PoolConfig, Priority, open_pool

    run_id = f"loadtest-{uuid.uuid4().hex[:8]}"
    pool_config = PoolConfig(backend=settings.backend, concurrency=settings.concurrency)
    async with open_pool(pool_config) as pool:

        async def infer(memory: WorkingMemory, tick: int) -> bool:
            request = InferenceRequest(
                id=uuid.uuid4().hex,
                run_id=run_id,
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
