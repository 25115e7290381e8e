"""Feed a `RunModel` from a live run's MQTT topics, and speak to NPCs as a player.

The viewer reads public topics and the trace only (DESIGN.md, "Trust boundary"), and
publishes nothing but a player's input. The connection is made in one function,
`_connect`, the only place that knows how npcsim clients connect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiomqtt

from sim import topics
from sim.bus import parse_url
from sim.errors import BrokerError
from sim.events import PlayerInputMessage, encode_json
from sim.view.model import RunModel
from sim.view.server import ViewSource

__all__ = ["LiveFeed", "LiveView"]

log = logging.getLogger(__name__)
_RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)


def _connect(url: str) -> aiomqtt.Client:
    host, port = parse_url(url)
    return aiomqtt.Client(host, port, keepalive=30, logger=logging.getLogger(__name__ + ".aiomqtt"))


class LiveFeed:
    """`await feed.run()` keeps the model current until cancelled, reconnecting when the broker goes."""

    def __init__(self, model: RunModel, url: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.url = url
        self._clock = clock
        self._client: aiomqtt.Client | None = None
        root = topics.run_root(model.run)
        self._filters = [
            f"{root}/agent/+/say",
            f"{root}/player/+/input",
            topics.world_state(model.run),
            f"{root}/status/+",
            f"{root}/trace/+",
            f"{root}/roster/+",
        ]

    async def run(self) -> None:
        attempt = 0
        while True:
            try:
                async with _connect(self.url) as client:
                    await client.subscribe([(f, 1) for f in self._filters])
                    self._client = client
                    attempt = 0
                    async for message in client.messages:
                        payload = message.payload
                        data = bytes(payload) if isinstance(payload, bytes | bytearray) else b""
                        self.model.feed(message.topic.value, data, self._clock())
            except aiomqtt.MqttError as exc:
                self._client = None
                delay = _RETRY_S[min(attempt, len(_RETRY_S) - 1)]
                attempt += 1
                # The first failure is often the run ending (`run --view`): only repeated ones warn.
                level = logging.WARNING if attempt > 1 else logging.INFO
                log.log(level, "view: broker %s unreachable (%s); retrying in %.1f s", self.url, exc, delay)
                await asyncio.sleep(delay)

    async def speak(self, player: str, message: PlayerInputMessage) -> None:
        """Publish a player's input on `player/{player}/input`; BrokerError when not connected."""
        client = self._client
        if client is None:
            raise BrokerError(f"view: not connected to the broker {self.url}")
        try:
            await client.publish(topics.player_input(self.model.run, player), encode_json(message), qos=1)
        except aiomqtt.MqttError as exc:
            raise BrokerError(f"view: publishing to {self.url} failed: {exc}") from exc


class LiveView:
    """A live run's view: served first (the port is checked at once), attached to the run later.

    `npcsim run --view` learns the broker's URL and the run id only once the run started.
    """

    def __init__(self, run: str = "") -> None:
        self.model = RunModel(run)
        self._feed: LiveFeed | None = None

    def source(self) -> ViewSource:
        return ViewSource(model=lambda _tick: self.model, live=True, speak=self._speak)

    async def follow(self, url: str, run: str) -> None:
        """Feed the model from the run's topics until cancelled."""
        self.model.run = run
        self._feed = LiveFeed(self.model, url)
        await self._feed.run()

    async def _speak(self, player: str, message: PlayerInputMessage) -> None:
        if self._feed is None:
            raise BrokerError("view: not attached to a run yet")
        await self._feed.speak(player, message)
