"""Helper processes: work that is a pure function of what it is given, on the machine's other core.

A shard's event loop is one thread. What it hands a helper (serving an inference: the pool's
worker process, `sim.inference._local`) runs beside it in a child process, `python -m
MODULE`, that speaks frames (`sim.wire.local`) on its stdin and stdout:

    helper = await Helper.start("sim.inference._local_worker", config_body, what="inference worker")
    helper.send(body)                  # a frame to the child
    while (body := await helper.read()) is not None: ...   # the child's frames, until it ends
    await helper.stop()                # close its stdin: it ends at once

The parent writes a configuration frame first; the child answers with a `Hello` when it is
ready, or with why it cannot start (`Helper.start` raises ConfigError with it). The end of
its stdin ends the child at once, whether the parent closed it or died (kill -9). On the
child's side `helper_main` does the plumbing: frames go out on a copy of the original stdout,
and stdout itself then points at stderr, so whatever the child's code prints cannot corrupt
them; SIGINT is ignored (Ctrl-C in a terminal reaches the whole process group: the parent
stops the child); and the child leaves without freeing its heap object by object.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

from sim.errors import ConfigError
from sim.wire.local import FRAME_HEADER, Hello, decode_hello, encode, frame, frame_size

__all__ = ["FRAME_ITEMS", "Helper", "helper_main", "read_frame"]

log = logging.getLogger(__name__)

FRAME_ITEMS = 8
"""Items (and answers) in a frame at most: the other end starts on them while this end
prepares the next ones. Frames of a whole turn of the event loop had each end wait for the other."""

_STOP_WAIT = 1.0  # seconds a stopping parent waits for its helper to end before killing it


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's body, or None at the end of the stream."""
    try:
        header = await reader.readexactly(FRAME_HEADER)
        return await reader.readexactly(frame_size(header))
    except asyncio.IncompleteReadError:
        return None


class Helper:
    """One running helper process and the pipe ends the parent holds."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self._stdin = process.stdin
        self._stdout = process.stdout

    @classmethod
    async def start(cls, module: str, config: bytes, *, what: str) -> Helper:
        """Start `python -m module`, send it `config`, wait for its `Hello`; ConfigError naming
        `what` when it cannot start."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        helper = cls(process)
        helper.send(config)
        body = await helper.read()
        hello = None if body is None else decode_hello(body)
        if hello is None or hello.error is not None:
            await helper.stop()
            raise ConfigError(f"the {what} process could not start: {'it exited' if hello is None else hello.error}")
        return helper

    def send(self, body: bytes) -> None:
        """Queue a frame for the child (a dead child's pipe takes it and drops it)."""
        self._stdin.write(frame(body))

    async def read(self) -> bytes | None:
        """The child's next frame, or None once it has ended."""
        return await read_frame(self._stdout)

    def kill(self) -> None:
        self.process.kill()

    async def ended(self) -> int:
        """Its exit code, once it has ended."""
        return await self.process.wait()

    async def stop(self) -> None:
        """Close its stdin (it ends at once), then wait a little and kill it if it has not."""
        self._stdin.close()
        try:
            async with asyncio.timeout(_STOP_WAIT):
                await self.process.wait()
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


Serve = Callable[[bytes, asyncio.StreamReader, Callable[[bytes], None]], Awaitable[str | None]]
"""A child's work: given its configuration frame, its input and a frame writer, it says
`Hello` through the writer and serves until the end of the input, or returns why it could not
start (nothing is written then). Returns None when it ran to the end."""


def helper_main(serve: Serve) -> NoReturn:
    """The child's side: the pipes set up, `serve` run to the end of stdin, then exit at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    frames_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    async def main() -> int:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        transport, _ = await loop.connect_write_pipe(asyncio.Protocol, frames_out)

        def write(body: bytes) -> None:
            transport.write(frame(body))

        config = await read_frame(reader)
        if config is None:
            return 0
        error = await serve(config, reader, write)
        if error is not None:
            write(encode(Hello(error=error)))
            return 1
        return 0

    code = asyncio.run(main())
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)

