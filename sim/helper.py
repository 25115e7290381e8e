"""Helper processes: npcsim's own code in a child process, on the machine's other cores.

An event loop is one thread. What it hands a helper runs beside it in a child process,
`python -m MODULE`, that speaks frames (`sim.wire.local`) on its stdin and stdout: serving
inferences (the pool's worker, `sim.inference._local`), parsing a large scenario
(`sim.shard._startup`), a pass over the audit (`sim.replay._parallel`), the load test's
sweep and its MQTT worker (`sim.loadtest`). Every process npcsim starts to run its own code
is one of these (the other child is Mosquitto, `sim.broker`; tests/test_layout.py holds the
code to that):

    helper = await Helper.start("sim.inference._local_worker", config_body, what="inference worker")
    helper.send(body)                  # a frame to the child
    while (body := await helper.read()) is not None: ...   # the child's frames, until it ends
    await helper.stop()                # close its stdin: it ends at once
    await helper.abort()               # or kill it now (a stop request in the middle of its work)

The parent writes a configuration frame first; the child answers with a `Hello` when it is
ready, or with why it cannot start (`Helper.start` raises ConfigError with it). The child
runs in a session of its own, so that Ctrl-C in a terminal (SIGINT to the foreground
process group) reaches the parent alone, even while the child is still starting: the
parent stops the child. The end of its stdin ends the child, whether the parent closed it
or died (kill -9): at once, or once the piece of work under way is done. On the child's
side `helper_main` does the plumbing: frames go out on a copy of the original stdout, and
stdout itself then points at stderr, so whatever the child's code prints cannot corrupt
them; what the child wrote reaches the parent before it exits; and it leaves without
freeing its heap object by object.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

from sim.errors import ConfigError
from sim.wire.local import FRAME_HEADER, Hello, decode_hello, encode, frame, frame_size

__all__ = ["FRAME_ITEMS", "FrameWriter", "Helper", "Serve", "helper_main", "read_frame"]

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
        self._end: asyncio.Task[int] | None = None

    @classmethod
    async def start(cls, module: str, config: bytes, *, what: str) -> Helper:
        """Start `python -m module`, send it `config`, wait for its `Hello`; ConfigError naming
        `what` when it cannot start."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        helper = cls(process)
        try:
            helper.send(config)
            body = await helper.read()
        except BaseException:
            await helper.abort()  # a stop request while it starts: it goes at once
            raise
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
        """Its exit code, once it has ended; frames not read are dropped (the asyncio process
        ends only with its pipes, and a reader paused on a full buffer would never see its end).

        One reaping task however many wait for it, shielded: a waiter cancelled (a timeout, a
        sibling's failure) leaves it to finish, so the child is always waited for."""
        if self._end is None:
            self._end = asyncio.ensure_future(self._reap())
        return await asyncio.shield(self._end)

    async def _reap(self) -> int:
        try:
            while await self._stdout.read(1 << 16):
                pass
            return await self.process.wait()
        except asyncio.CancelledError:
            self._reap_now()
            raise

    def _reap_now(self) -> None:
        """Its event loop is ending (every task cancelled) before the child was waited for: kill
        it, close the pipes and wait for it here, so that neither is left behind."""
        # asyncio.subprocess.Process has no public close: its transport has
        transport: asyncio.SubprocessTransport = self.process._transport  # type: ignore[attr-defined]
        popen = transport.get_extra_info("subprocess")
        transport.close()  # kills the child if it still runs
        popen.wait()

    def end_input(self) -> None:
        """Close its stdin: it ends once it has done with what it was sent."""
        self._stdin.close()

    async def stop(self) -> None:
        """Close its stdin (it ends at once), then wait a little and kill it if it has not.

        Cancelled while it waits (its owner's sibling failed), it kills the child and reaps it
        before the cancellation goes on: a child is never left running unwaited."""
        self.end_input()
        try:
            async with asyncio.timeout(_STOP_WAIT):
                await self.ended()
        except TimeoutError:
            await self.abort()
        except BaseException:
            await self.abort()
            raise

    async def abort(self) -> int:
        """Kill it now (a stop request while it works); its exit code once it has ended."""
        if self.process.returncode is None:
            self.process.kill()
        self._stdin.close()
        return await self.ended()


class FrameWriter(asyncio.Protocol):
    """The child's frames to its parent: `write(body)` queues one, `await drain()` waits until
    the pipe has taken most of them (a child that sends much waits for its parent to read)."""

    def __init__(self) -> None:
        self._room = asyncio.Event()
        self._room.set()
        self._closed = asyncio.get_running_loop().create_future()
        self._transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self._transport = transport

    def pause_writing(self) -> None:
        self._room.clear()

    def resume_writing(self) -> None:
        self._room.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._room.set()  # a parent gone takes nothing more: nobody waits for it
        if not self._closed.done():
            self._closed.set_result(None)

    def __call__(self, body: bytes) -> None:
        self.write(body)

    def write(self, body: bytes) -> None:
        assert self._transport is not None
        self._transport.write(frame(body))

    async def drain(self) -> None:
        await self._room.wait()

    async def close(self) -> None:
        """Every frame written handed to the pipe, then the pipe closed."""
        assert self._transport is not None
        self._transport.close()
        await self._closed


Serve = Callable[[bytes, asyncio.StreamReader, FrameWriter], Awaitable[str | None]]
"""A child's work: given its configuration frame, its input and a frame writer, it says
`Hello` through the writer and serves until the end of the input (or until its work is
done), or returns why it could not start (nothing is written then). Returns None when it ran
to the end."""


def helper_main(serve: Serve) -> NoReturn:
    """The child's side: the pipes set up, `serve` run to the end of stdin, then exit at once."""
    frames_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    async def main() -> int:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        _, write = await loop.connect_write_pipe(FrameWriter, frames_out)
        config = await read_frame(reader)
        if config is None:
            return 0
        error = await serve(config, reader, write)
        if error is not None:
            write(encode(Hello(error=error)))
        await write.close()
        return 0 if error is None else 1

    code = asyncio.run(main())
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)

