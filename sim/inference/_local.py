"""The pool's worker process: serving, as in process, on the machine's other core.

A shard's turns and the serving of its requests compete for one interpreter: with the
scripted backend, serving (the reply, the output checks) is a quarter of the work of each
line said. With `transport="process"` the pool starts one child of its own
(`python -m sim.inference._local_worker`) that serves each request exactly as the
in-process pool does (`sim.inference._serve`: the same backend, bounds and fact guard),
while the shard's thread goes on with other turns.

Requests go to the child's stdin and results come back on its stdout, as frames
(`sim.wire.local`) of at most `FRAME_ITEMS`, or of what one turn of the event loop made,
so that each end works on a frame while the other prepares the next. The child is the shard's own code, not a remote
worker: its results are not judged again. If it dies, it is started again and every
request it held is sent again; serving is deterministic for a deterministic backend, so
a crash changes no line said (after `MAX_RESTARTS` deaths in a row without a result, the
requests get the fallback line). It ends with the pool, and when the shard is killed,
the end of its stdin ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator

import msgspec

from sim.errors import ConfigError
from sim.inference._config import PoolConfig
from sim.inference._counters import Counters
from sim.inference._dispatch import Dispatch
from sim.inference._fallback import fallback_result
from sim.wire.batch import encode_batch
from sim.wire.inference import InferenceRequest, InferenceResult
from sim.wire.local import FRAME_HEADER, LocalReply, LocalWorkerConfig, decode_reply, frame, frame_size

__all__ = ["FRAME_ITEMS", "MAX_RESTARTS", "open_local_dispatch", "read_frame"]

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
"""Deaths of the worker process in a row, with no result in between, before the pool gives up on it."""

FRAME_ITEMS = 8
"""Requests (and results) in a frame at most: the other end starts on them while this end
prepares the next ones. Frames of a whole turn of the loop had each end wait for the other."""

_STOP_WAIT = 1.0  # seconds a closing pool waits for the worker to end before killing it


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's body, or None at the end of the stream."""
    try:
        header = await reader.readexactly(FRAME_HEADER)
        return await reader.readexactly(frame_size(header))
    except asyncio.IncompleteReadError:
        return None


class _Child:
    """One running worker process and the pipe ends the pool holds."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self.stdin = process.stdin
        self.stdout = process.stdout

    async def stop(self) -> None:
        """Close its stdin (it ends at once), then wait a little and kill it if it has not."""
        self.stdin.close()
        try:
            async with asyncio.timeout(_STOP_WAIT):
                await self.process.wait()
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


class _LocalDispatch:
    """Sends requests to the worker process, matches its results, starts it again when it dies."""

    def __init__(self, config: PoolConfig, counters: Counters) -> None:
        self._config = LocalWorkerConfig(
            backend=config.backend, options=dict(config.options), concurrency=config.concurrency,
            timeout=config.timeout, max_line_chars=config.max_line_chars, fact_guard=config.fact_guard,
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        self._counters = counters
        self._pending: dict[str, tuple[InferenceRequest, asyncio.Future[InferenceResult]]] = {}
        self._queued: list[InferenceRequest] = []
        self._child: _Child | None = None
        self._flush_soon = False
        self._given_up = False
        self._child_counts = (0, 0)  # the running child's (rejected outputs, dropped stale) so far

    async def start(self) -> _Child:
        """Start a worker process and wait until its backend is open; ConfigError when it cannot open."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sim.inference._local_worker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        child = _Child(process)
        child.stdin.write(frame(self._config))
        body = await read_frame(child.stdout)
        hello = None if body is None else decode_reply(body)
        if hello is None or hello.error is not None:
            await child.stop()
            why = "it exited" if hello is None else hello.error
            raise ConfigError(f"the inference worker process could not start: {why}")
        self._child, self._child_counts = child, (0, 0)
        return child

    async def __call__(self, request: InferenceRequest) -> InferenceResult:
        if self._given_up:
            return fallback_result(request, "backend_error", backend=self._config.backend,
                                   model=self._config.backend, worker="process")
        future: asyncio.Future[InferenceResult] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = (request, future)
        self._send(request)
        try:
            return await future
        finally:
            self._pending.pop(request.id, None)

    def _send(self, request: InferenceRequest) -> None:
        self._queued.append(request)
        if len(self._queued) >= FRAME_ITEMS:
            self._flush()
        elif not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """The requests queued, in one frame (slots bound what is in flight)."""
        self._flush_soon = False
        if self._child is not None and self._queued:
            self._child.stdin.write(frame(encode_batch(self._queued)))
        self._queued = []  # without a child, the restart sends every pending request

    async def run(self, child: _Child) -> None:
        """Take the results as they come; start the child again when it dies (until cancelled)."""
        deaths = 0
        running: _Child | None = child
        while True:
            code: int | None = None
            if running is not None:
                while (body := await read_frame(running.stdout)) is not None:
                    try:
                        reply = decode_reply(body)
                    except msgspec.DecodeError as exc:  # a bug, not an attack: the child is ours
                        log.error("a malformed frame from the inference worker process (%s): ending it", exc)
                        running.process.kill()
                        break
                    if reply.results:
                        deaths = 0
                    self._take(reply)
                code = await running.process.wait()
                self._child = running = None
            deaths += 1
            if deaths > MAX_RESTARTS:
                self._give_up(code)
                return
            log.warning("the inference worker process ended (exit code %s); starting it again and sending "
                        "it the %d requests it held", code, len(self._pending))
            try:
                running = await self.start()
            except ConfigError as exc:
                log.warning("%s", exc)
                continue
            self._queued = []
            if self._pending:
                running.stdin.write(frame(encode_batch([request for request, _ in self._pending.values()])))

    def _take(self, reply: LocalReply) -> None:
        rejected, stale = self._child_counts
        self._counters.rejected_outputs += reply.rejected_outputs - rejected
        self._counters.dropped_stale += reply.dropped_stale - stale
        self._child_counts = (reply.rejected_outputs, reply.dropped_stale)
        for result in reply.results:
            waiting = self._pending.get(result.id)
            if waiting is not None and not waiting[1].done():  # a request cancelled meanwhile is not waited for
                waiting[1].set_result(result)

    def _give_up(self, code: int | None) -> None:
        log.error("the inference worker process ended %d times in a row (exit code %s) without serving a "
                  "request; every request gets its fallback line", MAX_RESTARTS + 1, code)
        self._given_up = True
        for request, future in self._pending.values():
            if not future.done():
                future.set_result(fallback_result(request, "backend_error", backend=self._config.backend,
                                                  model=self._config.backend, worker="process"))

    async def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            await child.stop()


@contextlib.asynccontextmanager
async def open_local_dispatch(config: PoolConfig, counters: Counters) -> AsyncIterator[Dispatch]:
    """Start the worker process (ConfigError when its backend cannot open) and stop it on exit."""
    dispatch = _LocalDispatch(config, counters)
    child = await dispatch.start()
    try:
        async with asyncio.TaskGroup() as group:
            reader = group.create_task(dispatch.run(child), name="inference-worker-process")
            try:
                yield dispatch
            finally:
                reader.cancel()
    finally:
        await dispatch.close()
