"""A pool's worker process (`sim.inference._local`): `python -m sim.inference._local_worker`.

Given its configuration (`sim.wire.local.LocalWorkerConfig`) it opens the backend and says
it is ready (or why it cannot start), then serves every request of every frame that comes
(its pool's slots bound how many), as the in-process pool would (`sim.inference._serve`), and
writes the results back in frames of `FRAME_ITEMS`, or of those ready in one turn of its
event loop. The end of its input ends it at once, whatever it is serving (`sim.helper`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from sim.errors import NpcsimError
from sim.helper import FRAME_ITEMS, helper_main, read_frame
from sim.inference._counters import Counters, LogOnce
from sim.inference._serve import serve
from sim.inference.backends import Backend, open_backend
from sim.output import FactGuard, load_fact_guard
from sim.wire.inference import InferenceRequest, InferenceResult
from sim.wire.local import Hello, LocalReply, LocalWorkerConfig, decode_config, encode

log = logging.getLogger(__name__)


class _Replies:
    """The results ready, written in frames of at most `FRAME_ITEMS`, with what serving counted
    since the last frame."""

    def __init__(self, write: Callable[[bytes], None], counters: Counters) -> None:
        self._write = write
        self._counters = counters
        self._ready: list[InferenceResult] = []

    def add(self, result: InferenceResult) -> None:
        if not self._ready:
            asyncio.get_running_loop().call_soon(self._flush)
        self._ready.append(result)
        if len(self._ready) >= FRAME_ITEMS:
            self._flush()

    def _flush(self) -> None:
        if not self._ready:
            return
        c = self._counters
        reply = LocalReply(results=self._ready, rejected_outputs=c.rejected_outputs, dropped_stale=c.dropped_stale,
                           server_limits=c.server_limits())
        self._ready, c.rejected_outputs, c.dropped_stale = [], 0, 0
        self._write(encode(reply))


_requests = msgspec.msgpack.Decoder(list[InferenceRequest])


async def _serve_all(config: LocalWorkerConfig, backend: Backend, guard: FactGuard, reader: asyncio.StreamReader,
                     replies: _Replies, counters: Counters) -> None:
    """Serve every request that comes (the pool's slots bound how many are in flight); a
    frame that does not decode is a bug and ends the process (its pool starts another)."""
    warn = LogOnce(log)
    serving: set[asyncio.Task[None]] = set()

    async def handle(request: InferenceRequest) -> None:
        replies.add(await serve(request, backend, time_limit=config.timeout, rules=config.rules,
                                counters=counters, worker="process", warn=warn, guard=guard))

    try:
        while (body := await read_frame(reader)) is not None:
            for request in _requests.decode(body):
                task = asyncio.create_task(handle(request))
                serving.add(task)
                task.add_done_callback(serving.discard)
    finally:
        for task in serving:
            task.cancel()


async def _worker(body: bytes, reader: asyncio.StreamReader, write: Callable[[bytes], None]) -> str | None:
    """Open what serving needs, say so, serve; or why it could not start."""
    config = decode_config(body)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    counters = Counters()
    try:
        guard = load_fact_guard(config.rules.fact_guard)
        async with open_backend(config.backend, config.options, config.concurrency, config.timeout) as backend:
            write(encode(Hello()))
            await _serve_all(config, backend, guard, reader, _Replies(write, counters), counters)
    except NpcsimError as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    helper_main(_worker)
