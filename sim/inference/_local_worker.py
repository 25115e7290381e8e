"""A pool's worker process (`sim.inference._local`): `python -m sim.inference._local_worker`.

It reads its configuration from stdin (`sim.wire.local`), opens the backend and says it is
ready (or why it cannot start), then serves every request of every frame that comes, at
most `concurrency` at once, as the in-process pool would (`sim.inference._serve`), and
writes the results back in frames of `FRAME_ITEMS`, or of those ready in one turn of its
event loop. The end of
stdin (the pool closes, or its shard died) ends it at once, whatever it is serving.

Frames go out on a copy of the original stdout; stdout itself then points at stderr, so
whatever a backend prints cannot corrupt them. Ctrl-C in a terminal reaches the whole
process group: this process ignores SIGINT and leaves the stop to its shard.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import BinaryIO

from sim.errors import NpcsimError
from sim.inference._counters import Counters, LogOnce
from sim.inference._guard import load_fact_guard
from sim.inference._local import FRAME_ITEMS, read_frame
from sim.inference._serve import serve
from sim.inference.backends import Backend, open_backend
from sim.wire.batch import decode_batch
from sim.wire.inference import InferenceRequest, InferenceResult, decode_request
from sim.wire.local import LocalReply, LocalWorkerConfig, decode_config, frame

log = logging.getLogger(__name__)


class _Replies:
    """The results ready in one turn of the loop, written as one frame with the running counts."""

    def __init__(self, transport: asyncio.WriteTransport, counters: Counters) -> None:
        self._transport = transport
        self._counters = counters
        self._ready: list[InferenceResult] = []

    def send(self, reply: LocalReply) -> None:
        self._transport.write(frame(reply))

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
        ready, self._ready = self._ready, []
        self.send(LocalReply(results=ready, rejected_outputs=c.rejected_outputs, dropped_stale=c.dropped_stale))


async def _serve_all(config: LocalWorkerConfig, backend: Backend, reader: asyncio.StreamReader,
                     replies: _Replies, counters: Counters) -> None:
    guard = load_fact_guard(config.fact_guard)
    warn = LogOnce(log)
    slots = asyncio.Semaphore(config.concurrency)
    serving: set[asyncio.Task[None]] = set()

    async def handle(request: InferenceRequest) -> None:
        try:
            result = await serve(request, backend, time_limit=config.timeout, max_line_chars=config.max_line_chars,
                                 counters=counters, worker="process", warn=warn, guard=guard)
        finally:
            slots.release()
        replies.add(result)

    try:
        while (body := await read_frame(reader)) is not None:
            requests, errors = decode_batch(body, decode_request)
            if errors:
                raise NpcsimError(f"a malformed request from the pool: {errors[0]}")
            for request in requests:
                await slots.acquire()
                task = asyncio.create_task(handle(request))
                serving.add(task)
                task.add_done_callback(serving.discard)
    finally:
        for task in serving:
            task.cancel()


async def _main(frames_out: BinaryIO) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, frames_out)
    counters = Counters()
    replies = _Replies(transport, counters)
    body = await read_frame(reader)
    if body is None:
        return 0
    config = decode_config(body)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        async with open_backend(config.backend, config.options, config.concurrency, config.timeout) as backend:
            replies.send(LocalReply())
            await _serve_all(config, backend, reader, replies, counters)
    except NpcsimError as exc:
        replies.send(LocalReply(error=str(exc)))
        return 1
    return 0


def main() -> None:
    """Serve until the end of stdin, then leave at once: freeing a long run's caches object by
    object would hold up the shard that waits for this process to end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    frames_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    code = asyncio.run(_main(frames_out))
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
