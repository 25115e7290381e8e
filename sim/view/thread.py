"""The live view on its own thread and event loop, for `npcsim run --view`.

A shard of a large world keeps its event loop busy for long stretches (a tick of 10,000
NPCs); a view on that loop would answer the page only between them. On its own loop the
view shares the interpreter with the shard but is scheduled every few milliseconds, so
the page stays responsive (docs/benchmarks.md). Everything the view owns (its model, its
MQTT client, its HTTP server) lives on that loop; the shard's loop only calls `attach`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from sim.errors import NpcsimError
from sim.mqtt import BrokerAddress
from sim.view.live import LiveView
from sim.view.server import DEFAULT_PLAYER, build_app, open_view_server

__all__ = ["ViewThread", "open_view_thread"]

_START_TIMEOUT_S = 60.0


class ViewThread:
    """Use `open_view_thread`; `url` is the page's address once it started."""

    def __init__(
        self, host: str, port: int, *, player: str = DEFAULT_PLAYER, password: str | None = None,
        option: str = "--port",
    ) -> None:
        self.view = LiveView(player=player)
        self.url = ""
        self._host, self._port, self._password, self._option = host, port, password, option
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._follow: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, name="npcsim-view", daemon=True)

    def attach(self, address: BrokerAddress, run: str) -> None:
        """Follow the run's topics (thread-safe; called from the shard's loop)."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._start_follow, address, run)

    def detach(self) -> None:
        """Stop following (thread-safe): the run is stopping, its broker is about to go."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._stop_follow)

    def _stop_follow(self) -> None:
        if self._follow is not None:
            self._follow.cancel()

    def _start_follow(self, address: BrokerAddress, run: str) -> None:
        self._follow = asyncio.get_running_loop().create_task(self.view.follow(address, run), name="view-follow")

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread, which raises it
            self._error = exc
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = build_app(self.view.source())
        async with open_view_server(app, self._host, self._port, password=self._password,
                                    option=self._option) as url:
            self.url = url
            self._started.set()
            try:
                await self._stop.wait()
            finally:
                if self._follow is not None:
                    self._follow.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._follow

    def _start(self) -> None:
        self._thread.start()
        if not self._started.wait(_START_TIMEOUT_S):
            raise NpcsimError(f"the view did not start on {self._host}:{self._port} within {_START_TIMEOUT_S:.0f} s")
        if self._error is not None:
            raise self._error

    def _close(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop may have ended already
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout=30)


@contextlib.contextmanager
def open_view_thread(
    host: str, port: int, *, player: str = DEFAULT_PLAYER, password: str | None = None, option: str = "--port"
) -> Iterator[ViewThread]:
    """Start the view's server on its thread (a port in use is a ConfigError naming `option`); stop it on exit.

    The view speaks as `player`; with a `password` it asks for a login (HTTP basic).
    """
    thread = ViewThread(host, port, player=player, password=password, option=option)
    thread._start()
    try:
        yield thread
    finally:
        thread._close()
