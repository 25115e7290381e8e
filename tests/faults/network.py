"""Network faults between one shard and the broker: a network namespace on a veth pair, and a fault proxy.

The machine has no netem, so a partition is the veth link taken down (the shard in its own
namespace, the broker listening on the host end's address) and resets and stalls go
through `FaultProxy`, an asyncio TCP proxy on loopback between the shard and the broker.
Both are context managers that remove what they made however the schedule ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

__all__ = ["FaultProxy", "Netns", "fault_proxy", "netns"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@dataclass(frozen=True)
class Netns:
    name: str
    host_if: str
    host_addr: str  # the broker listens here too
    inner_addr: str

    @property
    def wrap(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def link(self, up: bool) -> None:
        _ip("link", "set", self.host_if, "up" if up else "down")


@contextlib.contextmanager
def netns(tag: int) -> Iterator[Netns]:
    """A namespace joined to this one by a veth pair on 10.201.{tag % 250}.0/30; removed at the end."""
    n = tag % 250
    ns = Netns(f"npcfz{os.getpid()}x{n}", f"fzh{os.getpid() % 100000}x{n}"[:15], f"10.201.{n}.1", f"10.201.{n}.2")
    inner = f"fzn{os.getpid() % 100000}x{n}"[:15]
    try:
        _ip("netns", "add", ns.name)
        _ip("link", "add", ns.host_if, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns.name)
        _ip("addr", "add", f"{ns.host_addr}/30", "dev", ns.host_if)
        _ip("link", "set", ns.host_if, "up")
        _ip("netns", "exec", ns.name, "ip", "addr", "add", f"{ns.inner_addr}/30", "dev", inner)
        _ip("netns", "exec", ns.name, "ip", "link", "set", inner, "up")
        _ip("netns", "exec", ns.name, "ip", "link", "set", "lo", "up")
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", ns.host_if], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=10)


class FaultProxy:
    """Forwards loopback TCP to `upstream_port`; `reset()` cuts every connection with an RST,
    `stall(s)` holds every byte for `s` seconds (`held` counts the chunks it held), `delay_s`
    adds latency to every chunk; `hold_upward` holds what the client sends (its acknowledgements
    too) while the broker's bytes still pass, until it is unset or the link reset."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.delay_s = 0.0
        self.resets = 0
        self.held = 0
        self._open = asyncio.Event()
        self._open.set()
        self.hold_upward = False
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        pair = (writer, up_writer)
        self._conns.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_writer, upward=True), self._pipe(up_reader, writer))
        finally:
            self._conns.discard(pair)
            for w in pair:
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upward: bool = False) -> None:
        try:
            while chunk := await reader.read(65536):
                if upward and self.hold_upward:
                    self.held += 1
                    continue  # never sent: the link is reset before it is let go
                if not self._open.is_set():
                    self.held += 1
                    await self._open.wait()
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)  # the subject: a slow link
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def reset(self) -> None:
        """Every connection ends with an RST (SO_LINGER 0), both ways."""
        self.resets += 1
        for pair in list(self._conns):
            for w in pair:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                w.transport.abort()

    async def stall(self, seconds: float) -> None:
        self._open.clear()
        try:
            await asyncio.sleep(seconds)  # the subject: a link that passes nothing for a while
        finally:
            self._open.set()




@contextlib.asynccontextmanager
async def fault_proxy(upstream_port: int) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(upstream_port)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        proxy.reset()
        await server.wait_closed()
