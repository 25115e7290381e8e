"""The pool's worker process: serving, as in process, on the machine's other core.

A shard's turns and the serving of its requests compete for one interpreter: with the
scripted backend, serving (the reply, the output checks) is a quarter of the work of each
line said. With `transport="process"` the pool starts a helper process of its own
(`sim.helper`: `python -m sim.inference._local_worker`) that serves each request exactly as
the in-process pool does (`sim.inference._serve`: the same backend, bounds and fact guard),
while the shard's thread goes on with other turns.

Requests and results travel as frames (`sim.wire.local`) of at most `sim.helper.FRAME_ITEMS`, or of
what one turn of the event loop made, so that each end works on a frame while the other
prepares the next. The child is the shard's own code, not a remote worker: its results are
not judged again. If it dies, it is started again and every request it held is sent again;
serving is deterministic for a deterministic backend, so a crash changes no line said
(after `sim.helper.MAX_RESTARTS` deaths in a row without a result, the requests get the
fallback line). It ends with the pool, and when the shard is killed, the end of its stdin ends it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Hashable

from sim.helper import Exchange
from sim.inference._config import PoolConfig
from sim.inference._counters import Counters
from sim.inference._dispatch import Dispatch
from sim.inference._fallback import fallback_result
from sim.wire.batch import encode_batch
from sim.wire.inference import InferenceRequest, InferenceResult
from sim.wire.local import LocalReply, LocalWorkerConfig, decode, encode

__all__ = ["open_local_dispatch"]


class _LocalDispatch(Exchange[InferenceRequest, InferenceResult]):
    """Requests to the worker process, results matched by request id; its counts into the pool's."""

    def __init__(self, config: PoolConfig, counters: Counters) -> None:
        self._worker_config = LocalWorkerConfig(
            backend=config.backend, options=dict(config.options), concurrency=config.concurrency,
            timeout=config.timeout, max_line_chars=config.max_line_chars, fact_guard=config.fact_guard,
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        super().__init__("sim.inference._local_worker", encode(self._worker_config), what="inference worker",
                         without="every request gets its fallback line")
        self._counters = counters
        self._child_counts = (0, 0)  # the running child's (rejected outputs, dropped stale) so far

    def started(self) -> None:
        self._child_counts = (0, 0)

    def key(self, item: InferenceRequest) -> Hashable:
        return item.id

    def encode_items(self, items: list[InferenceRequest]) -> bytes:
        return encode_batch(items)

    def decode_answers(self, body: bytes) -> list[tuple[Hashable, InferenceResult]]:
        reply = decode(body, LocalReply)
        rejected, stale = self._child_counts
        self._counters.rejected_outputs += reply.rejected_outputs - rejected
        self._counters.dropped_stale += reply.dropped_stale - stale
        self._child_counts = (reply.rejected_outputs, reply.dropped_stale)
        return [(result.id, result) for result in reply.results]

    def given_up(self, item: InferenceRequest) -> InferenceResult:
        backend = self._worker_config.backend
        return fallback_result(item, "backend_error", backend=backend, model=backend, worker="process")


@contextlib.asynccontextmanager
async def open_local_dispatch(config: PoolConfig, counters: Counters) -> AsyncIterator[Dispatch]:
    """Start the worker process (ConfigError when its backend cannot open) and stop it on exit."""
    dispatch = _LocalDispatch(config, counters)
    async with dispatch.running():
        yield dispatch.ask
