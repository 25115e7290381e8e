"""The bus's transport seam: how it reaches a broker (MQTT by default, in memory in tests).

The bus holds its outbox, subscriptions and routing itself; what it needs of a broker is a
connection that lasts, and that much is a `Transport`:

    async def session(link: Link) -> None:            # called on every (re)connection
        await link.subscribe(filters)
        async for topic, payload, retained in link.messages(): ...

    await transport.run(session, on_lost=mark_disconnected)

`MqttTransport` is that over sim.mqtt (one aiomqtt client at a time, reconnected per the
policy, with the shard's last will); any object with the same two methods serves, such as
the in-memory broker the tests run shards on.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Literal, Protocol

import aiomqtt

from sim.errors import BrokerError
from sim.mqtt import BrokerAddress, ReconnectPolicy, mqtt_error, open_client, redact, stay_connected

__all__ = ["SESSION_KEPT_S", "Link", "MqttTransport", "Transport"]

SESSION_KEPT_S = 60
"""Seconds the broker keeps a bus's session after its connection is lost (MQTT 5): long
enough for a reconnection, short enough that a killed process's session does not queue
messages for long. A restarted process starts a session of its own."""

_SUBSCRIBE_CHUNK = 500  # filters per SUBSCRIBE packet


class Link(Protocol):
    """One live connection to the broker."""

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        """Send one message and wait for its acknowledgement; BrokerError when the connection
        failed (the bus retries it). It may wait until cancelled when the connection is lost."""
        ...

    async def subscribe(self, filters: Sequence[str]) -> None:
        """Subscribe to `filters` (QoS 1) on this connection."""
        ...

    def messages(self) -> AsyncIterator[tuple[str, bytes, bool]]:
        """Every message received, as (topic, payload, retained), until the connection ends;
        `retained`: the broker kept it from before the subscription (the MQTT retain flag)."""
        ...


class Transport(Protocol):
    """Holds a connection to the broker for the bus."""

    async def run(self, session: Callable[[Link], Awaitable[None]], *, on_lost: Callable[[], None]) -> None:
        """Run `session(link)` on a connection, and again on a new one after each loss, until
        it returns; `on_lost` is called when a connection ends. Raises BrokerError when it
        gives up."""
        ...


class _MqttLink:
    def __init__(self, client: aiomqtt.Client) -> None:
        self._client = client

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        try:
            # no timeout of its own (a timer per message): the bus cancels what a lost connection holds
            await self._client.publish(topic, payload, qos=qos, retain=retain, timeout=math.inf)
        except (aiomqtt.MqttError, BaseExceptionGroup) as exc:
            error = mqtt_error(exc)
            if error is None:
                raise
            raise BrokerError(f"publishing to {topic} failed: {redact(str(error))}") from exc

    async def subscribe(self, filters: Sequence[str]) -> None:
        for i in range(0, len(filters), _SUBSCRIBE_CHUNK):
            await self._client.subscribe([(f, 1) for f in filters[i : i + _SUBSCRIBE_CHUNK]])

    async def messages(self) -> AsyncIterator[tuple[str, bytes, bool]]:
        async for message in self._client.messages:
            payload = message.payload
            # paho hands every received payload over as bytes; anything else is junk the router counts
            data = bytes(payload) if isinstance(payload, bytes | bytearray) else b""
            yield message.topic.value, data, bool(message.retain)


class MqttTransport:
    """The bus's connection over sim.mqtt: login, TLS, last will, reconnection with backoff."""

    def __init__(
        self,
        address: BrokerAddress,
        *,
        name: str,
        policy: ReconnectPolicy,
        protocol: Literal[5, 311] = 5,
        will: tuple[str, bytes] | None = None,
        timeout: float = 10.0,
        max_inflight: int | None = None,
    ) -> None:
        self.address = address
        self._name = name
        self._policy = policy
        self._protocol: Literal[5, 311] = protocol
        self._will = will
        self._timeout = timeout
        self._max_inflight = max_inflight
        # One MQTT session for this transport's life: a connection lost and made again takes
        # up the session the broker kept, so a QoS 1 message the broker had sent on the lost
        # connection (a player's input, acknowledged to its publisher) is sent again, not lost.
        # The first connection starts clean; another process never takes this one's session.
        self._identifier = f"npcsim-{secrets.token_hex(8)}"
        self._connected = False

    def _client(self) -> aiomqtt.Client:
        will = None if self._will is None else aiomqtt.Will(self._will[0], self._will[1], qos=1, retain=True)
        return open_client(
            self.address, protocol=self._protocol, will=will, timeout=self._timeout, max_inflight=self._max_inflight,
            identifier=self._identifier, session_expiry=SESSION_KEPT_S, resume_session=self._connected,
        )

    async def run(self, session: Callable[[Link], Awaitable[None]], *, on_lost: Callable[[], None]) -> None:
        async def on_client(client: aiomqtt.Client) -> None:
            self._connected = True
            await session(_MqttLink(client))

        await stay_connected(
            self.address, on_client, name=self._name, policy=self._policy, connect=self._client, on_lost=on_lost
        )
