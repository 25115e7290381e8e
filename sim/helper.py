"""Helper processes: work that is a pure function of what it is given, on the machine's other core.

A shard's event loop is one thread. What it hands a helper (serving an inference: the pool's
worker process, `sim.inference._local`) runs beside it in a child process, `python -m
MODULE`, that speaks frames (`sim.wire.local`) on its stdin and stdout:

    helper = await Helper.start("sim.inference._local_worker", config_body, what="inference worker")
    helper.send(body)                  # a frame to the child
    while (body := await helper.read()) is not None: ...   # the child's frames, until it ends
    await helper.stop()                # close its stdin: it ends at once

`Exchange` is the usual use: items asked of the helper and their answers awaited, in frames
of a few, with the helper started again when it dies.

The parent writes a configuration frame first; the child answers with a `Hello` when it is
ready, or with why it cannot start (`Helper.start` raises ConfigError with it). The end of
its stdin ends the child at once, whether the parent closed it or died (kill -9). On the
child's side `helper_main` does the plumbing: frames go out on a copy of the original stdout,
and stdout itself then points at stderr, so whatever the child's code prints cannot corrupt
them; SIGINT is ignored (Ctrl-C in a terminal reaches the whole process group: the parent
stops the child); and the child leaves without freeing its heap object by object.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Generic, NoReturn, TypeVar

import msgspec

from sim.errors import ConfigError, single_error
from sim.wire.local import FRAME_HEADER, Hello, decode, encode, frame, frame_size

__all__ = ["FRAME_ITEMS", "MAX_RESTARTS", "Exchange", "Helper", "helper_main", "read_frame"]

log = logging.getLogger(__name__)

FRAME_ITEMS = 8
"""Items (and answers) in a frame at most: the other end starts on them while this end
prepares the next ones. Frames of a whole turn of the event loop had each end wait for the other."""

MAX_RESTARTS = 3
"""Deaths of a helper in a row, with no answer in between, before its parent gives up on it."""

_STOP_WAIT = 1.0  # seconds a stopping parent waits for its helper to end before killing it

Q = TypeVar("Q")
A = TypeVar("A")


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
        hello = None if body is None else decode(body, Hello)
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


class Exchange(abc.ABC, Generic[Q, A]):
    """Items sent to a helper process and their answers awaited; the helper started again when it dies.

    `ask(item)` queues the item and waits for its answer; the items queued go to the helper in
    frames of at most `FRAME_ITEMS` (or what one turn of the event loop queued), and `run`
    takes the answers as they come. When the helper dies, another is started and sent every
    item the dead one held; after `MAX_RESTARTS` deaths in a row without an answer, every item
    waiting and every later one is answered by `given_up`. A subclass says how items and
    answers travel: `key`, `encode_items`, `decode_answers`, and `given_up`.
    """

    def __init__(self, module: str, config: bytes, *, what: str, without: str) -> None:
        self._module = module
        self._config = config
        self._what = what
        self._without = without  # what happens once the helper is given up on, for the log
        self._pending: dict[Hashable, tuple[Q, asyncio.Future[A]]] = {}
        self._queued: list[Q] = []
        self._helper: Helper | None = None
        self._flush_soon = False
        self._given_up = False

    # --- what a subclass says ----------------------------------------------------------

    @abc.abstractmethod
    def key(self, item: Q) -> Hashable:
        """What the helper's answer to `item` is matched by."""
        ...

    @abc.abstractmethod
    def encode_items(self, items: list[Q]) -> bytes:
        ...

    @abc.abstractmethod
    def decode_answers(self, body: bytes) -> list[tuple[Hashable, A]]:
        """The (key, answer) pairs of a frame from the helper; msgspec.DecodeError ends the helper."""
        ...

    @abc.abstractmethod
    def given_up(self, item: Q) -> A:
        """The answer to `item` once the helper has been given up on."""
        ...

    def started(self) -> None:
        """A new helper is running (the first, or one started after a death)."""

    # --- the exchange ------------------------------------------------------------------

    async def start(self) -> Helper:
        """Start the helper (ConfigError when it cannot start)."""
        helper = await Helper.start(self._module, self._config, what=self._what)
        self._helper = helper
        self.started()
        return helper

    async def ask(self, item: Q) -> A:
        if self._given_up:
            return self.given_up(item)
        future: asyncio.Future[A] = asyncio.get_running_loop().create_future()
        key = self.key(item)
        self._pending[key] = (item, future)
        self._queued.append(item)
        if len(self._queued) >= FRAME_ITEMS:
            self._flush()
        elif not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush)
        try:
            return await future
        finally:
            self._pending.pop(key, None)

    def _flush(self) -> None:
        self._flush_soon = False
        if self._helper is not None and self._queued:
            self._helper.send(self.encode_items(self._queued))
        self._queued = []  # without a helper, the next one is sent every pending item

    async def run(self, helper: Helper) -> None:
        """Take the answers as they come; start the helper again when it dies (until cancelled)."""
        deaths = 0
        running: Helper | None = helper
        while True:
            code: int | None = None
            if running is not None:
                while (body := await running.read()) is not None:
                    try:
                        answers = self.decode_answers(body)
                    except msgspec.DecodeError as exc:  # a bug, not an attack: the helper is ours
                        log.error("a malformed frame from the %s process (%s): ending it", self._what, exc)
                        running.kill()
                        break
                    if answers:
                        deaths = 0
                    for key, answer in answers:
                        waiting = self._pending.get(key)
                        if waiting is not None and not waiting[1].done():  # one cancelled meanwhile is not waited for
                            waiting[1].set_result(answer)
                code = await running.ended()
                self._helper = running = None
            deaths += 1
            if deaths > MAX_RESTARTS:
                self._give_up(code)
                return
            log.warning("the %s process ended (exit code %s); starting it again and sending it the %d items "
                        "it held", self._what, code, len(self._pending))
            try:
                running = await self.start()
            except ConfigError as exc:
                log.warning("%s", exc)
                continue
            self._queued = []
            if self._pending:
                running.send(self.encode_items([item for item, _ in self._pending.values()]))

    def _give_up(self, code: int | None) -> None:
        log.error("the %s process ended %d times in a row (exit code %s) without answering: %s", self._what,
                  MAX_RESTARTS + 1, code, self._without)
        self._given_up = True
        for item, future in self._pending.values():
            if not future.done():
                future.set_result(self.given_up(item))

    async def close(self) -> None:
        helper, self._helper = self._helper, None
        if helper is not None:
            await helper.stop()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Start the helper (ConfigError when it cannot start), take its answers while the block
        runs, stop it after; an error of the block comes out as itself, not in a group."""
        helper = await self.start()
        try:
            async with asyncio.TaskGroup() as group:
                reader = group.create_task(self.run(helper), name=f"{self._what} process")
                try:
                    yield
                finally:
                    reader.cancel()
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None
        finally:
            await self.close()


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

