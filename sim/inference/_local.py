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
(after `MAX_RESTARTS` deaths in a row without a result, the requests get the fallback
line). It ends with the pool, and when the shard is killed, the end of its stdin ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import msgspec

from sim.errors import ConfigError, single_error
from sim.helper import FRAME_ITEMS, Helper
from sim.inference._counters import Counters
from sim.inference._dispatch import Dispatch, fallback_result
from sim.inference._pool_config import PoolConfig
from sim.wire.batch import encode_batch
from sim.wire.inference import InferenceRequest, InferenceResult
from sim.wire.local import LocalWorkerConfig, decode_reply, encode

__all__ = ["MAX_RESTARTS", "open_local_dispatch"]

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
"""Deaths of the worker process in a row, with no result in between, before the pool gives up on it."""


class _LocalDispatch:
    """Requests to the worker process in frames, results matched by request id; the worker
    started again when it dies."""

    def __init__(self, config: PoolConfig, counters: Counters) -> None:
        self._config = LocalWorkerConfig(
            backend=config.backend, options=dict(config.options), concurrency=config.concurrency,
            timeout=config.timeout, rules=config.rules,
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        self._counters = counters
        self._pending: dict[str, tuple[InferenceRequest, asyncio.Future[InferenceResult]]] = {}
        self._queued: list[InferenceRequest] = []
        self._child: Helper | None = None
        self._flush_soon = False
        self._given_up = False

    async def start(self) -> Helper:
        """Start a worker process and wait until its backend is open; ConfigError when it cannot open."""
        self._child = await Helper.start("sim.inference._local_worker", encode(self._config), what="inference worker")
        return self._child

    async def __call__(self, request: InferenceRequest) -> InferenceResult:
        if self._given_up:
            return self._fallback(request)
        future: asyncio.Future[InferenceResult] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = (request, future)
        self._queued.append(request)
        if len(self._queued) >= FRAME_ITEMS:
            self._flush()
        elif not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush)
        try:
            return await future
        finally:
            self._pending.pop(request.id, None)

    def _flush(self) -> None:
        """The requests queued, in one frame (the pool's slots bound what is in flight)."""
        self._flush_soon = False
        if self._child is not None and self._queued:
            self._child.send(encode_batch(self._queued))
        self._queued = []  # without a child, the restart sends every pending request

    async def run(self, child: Helper) -> None:
        """Take the results as they come; start the child again when it dies (until cancelled)."""
        deaths = 0
        running: Helper | None = child
        while True:
            code: int | None = None
            if running is not None:
                while (body := await running.read()) is not None:
                    try:
                        reply = decode_reply(body)
                    except msgspec.DecodeError as exc:  # a bug, not an attack: the child is ours
                        log.error("a malformed frame from the inference worker process (%s): ending it", exc)
                        running.kill()
                        break
                    self._counters.rejected_outputs += reply.rejected_outputs
                    self._counters.dropped_stale += reply.dropped_stale
                    if reply.server_limits:
                        self._counters.hear_limits("process", reply.server_limits)
                    if reply.results:
                        deaths = 0
                    for result in reply.results:
                        waiting = self._pending.get(result.id)
                        if waiting is not None and not waiting[1].done():  # one cancelled meanwhile is not waited for
                            waiting[1].set_result(result)
                code = await running.ended()
                self._child = running = None
            deaths += 1
            if deaths > MAX_RESTARTS:
                self._give_up(code)
                return
            log.warning("the inference worker process ended (exit code %s); starting it again and sending it the "
                        "%d requests it held", code, len(self._pending))
            try:
                running = await self.start()
            except ConfigError as exc:
                log.warning("%s", exc)
                continue
            self._queued = []
            if self._pending:
                running.send(encode_batch([request for request, _ in self._pending.values()]))

    def _fallback(self, request: InferenceRequest) -> InferenceResult:
        backend = self._config.backend
        return fallback_result(request, "backend_error", backend=backend, model=backend, worker="process")

    def _give_up(self, code: int | None) -> None:
        log.error("the inference worker process ended %d times in a row (exit code %s) without serving a request: "
                  "every request gets its fallback line", MAX_RESTARTS + 1, code)
        self._given_up = True
        for request, future in self._pending.values():
            if not future.done():
                future.set_result(self._fallback(request))

    async def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            await child.stop()


@contextlib.asynccontextmanager
async def open_local_dispatch(config: PoolConfig, counters: Counters) -> AsyncIterator[Dispatch]:
    """Start the worker process (ConfigError when its backend cannot open) and stop it on exit;
    an error of the block comes out as itself, not in a group."""
    dispatch = _LocalDispatch(config, counters)
    child = await dispatch.start()
    try:
        async with asyncio.TaskGroup() as group:
            reader = group.create_task(dispatch.run(child), name="inference-worker-process")
            try:
                yield dispatch
            finally:
                reader.cancel()
    except BaseExceptionGroup as group_error:
        raise single_error(group_error) from None
    finally:
        await dispatch.close()
