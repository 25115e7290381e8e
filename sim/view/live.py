"""Feed a `RunModel` from a live run's MQTT topics, and speak to NPCs as a player.

The viewer reads public topics, the trace and the roster only (docs/operations.md,
"Security"), and publishes nothing but the input of the one player its operator named. It
connects through a `sim.mqtt.Transport` like every npcsim client: login from the URL or
the environment, TLS, the one reconnect policy; it waits for its broker as long as it
takes. A publish the broker refuses (an ACL that does not let this login speak as that
player) is a BrokerError, not a success (`MqttTransport(check_refusals=True)`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sim.errors import BrokerError
from sim.mqtt import BrokerAddress, Link, MqttTransport, ReconnectPolicy, Transport
from sim.view.model import RunModel
from sim.view.server import DEFAULT_PLAYER, ViewSource
from sim.wire import topics
from sim.wire.events import PlayerInputMessage, encode_json

__all__ = ["LiveFeed", "LiveView"]


class LiveFeed:
    """`await feed.run()` keeps the model current until cancelled, reconnecting when the broker goes."""

    def __init__(
        self, model: RunModel, address: BrokerAddress, clock: Callable[[], float] = time.monotonic,
        *, transport: Transport | None = None,
    ) -> None:
        self.model = model
        self.address = address
        self._clock = clock
        self._transport = transport or MqttTransport(
            address, name="view", policy=ReconnectPolicy(patience=None), check_refusals=True
        )
        self._link: Link | None = None
        root = topics.run_root(model.run)
        self._filters = [
            f"{root}/agent/+/say",
            topics.agent_location_all(model.run),
            f"{root}/player/+/input",
            f"{root}/player/+/error",
            topics.world_state(model.run),
            f"{root}/status/+",
            f"{root}/trace/+",
            f"{root}/roster/+",
        ]

    async def run(self) -> None:
        await self._transport.run(self._session, on_lost=self._lost)

    async def _session(self, link: Link) -> None:
        await link.subscribe(self._filters)
        self._link = link
        async for topic, payload, _ in link.messages():
            self.model.feed(topic, payload, self._clock())

    def _lost(self) -> None:
        self._link = None

    async def speak(self, player: str, message: PlayerInputMessage) -> None:
        """Publish a player's input on `player/{player}/input`; BrokerError when not connected or refused."""
        link = self._link
        if link is None:
            raise BrokerError(f"view: not connected to the broker {self.address.url}")
        await link.publish(topics.player_input(self.model.run, player), encode_json(message), qos=1, retain=False)


class LiveView:
    """A live run's view: served first (the port is checked at once), attached to the run later.

    `npcsim run --view` learns the broker's URL and the run id only once the run started.
    """

    def __init__(self, run: str = "", *, player: str = DEFAULT_PLAYER) -> None:
        self.model = RunModel(run)
        self.player = player
        self._feed: LiveFeed | None = None

    def source(self) -> ViewSource:
        return ViewSource(model=lambda _tick: self.model, live=True, speak=self._speak, player=self.player)

    async def follow(self, address: BrokerAddress, run: str) -> None:
        """Feed the model from the run's topics until cancelled."""
        self.model.run = run
        self._feed = LiveFeed(self.model, address)
        await self._feed.run()

    async def _speak(self, player: str, message: PlayerInputMessage) -> None:
        if self._feed is None:
            raise BrokerError("view: not attached to a run yet")
        await self._feed.speak(player, message)
