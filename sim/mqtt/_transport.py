"""The transport seam: how an npcsim component reaches a broker (MQTT by default, in memory in tests).

What a component needs of a broker is a connection that lasts, and that much is a `Transport`:

    async def session(link: Link) -> None:            # called on every (re)connection
        await link.subscribe(filters)
        async for topic, payload, retained in link.messages(): ...

    await transport.run(session, on_lost=mark_disconnected)

`MqttTransport` is that over this package's clients (one aiomqtt client at a time, login
and TLS from the address, reconnected per the policy, with an optional last will and MQTT 5
session); `LocalBroker` serves the same seam in one process. The bus, the run-nonce
handshake, the inference pool and worker, `subscribe` and the live view all connect
through it, so the in-memory broker can stand in for each of them.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import aiomqtt

from sim.errors import BrokerError
from sim.mqtt._address import BrokerAddress
from sim.mqtt._connection import LinkLost, ReconnectPolicy, mqtt_error, open_client, stay_connected

__all__ = [
    "SESSION_KEPT_S", "ClientOptions", "LastWill", "Link", "MqttTransport", "Session", "Transport", "topic_matches",
]

SESSION_KEPT_S = 60
"""Seconds the broker keeps a kept session after its connection is lost (MQTT 5): long
enough for a reconnection, short enough that a killed process's session does not queue
messages for long. A restarted process starts a session of its own."""

_SUBSCRIBE_CHUNK = 500  # filters per SUBSCRIBE packet


class LastWill(NamedTuple):
    """What the broker publishes (QoS 1) for a client whose connection dies."""

    topic: str
    payload: bytes
    retain: bool


class Link(Protocol):
    """One live connection to the broker."""

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        """Send one message and wait for its acknowledgement; BrokerError when the connection
        failed (raised out of a session, it ends the connection, which is made again)."""
        ...

    async def subscribe(self, filters: Sequence[str]) -> None:
        """Subscribe to `filters` (QoS 1) on this connection."""
        ...

    def messages(self) -> AsyncIterator[tuple[str, bytes, bool]]:
        """Every message received, as (topic, payload, retained), until the connection ends;
        `retained`: the broker kept it from before the subscription (the MQTT retain flag)."""
        ...


Session = Callable[[Link], Awaitable[None]]
"""What runs on each connection a transport makes."""


class Transport(Protocol):
    """Holds a connection to the broker."""

    async def run(self, session: Session, *, on_lost: Callable[[], None] | None = None) -> None:
        """Run `session(link)` on a connection, and again on a new one after each loss, until
        it returns; `on_lost` is called when a connection ends. Raises BrokerError when it
        gives up."""
        ...


def topic_matches(topic: str, pattern: str) -> bool:
    """Whether `topic` matches the subscription filter `pattern` (MQTT's `+` and `#`)."""
    return aiomqtt.Topic(topic).matches(pattern)


class Redeliveries:
    """What a kept session was delivered lately, so that a redelivery is recognised.

    MQTT's QoS 1 is at least once: a message the broker sent on a connection that was lost
    before our acknowledgement reached it is sent again on the session's next connection,
    with the same packet id. The broker numbers a session's messages in turn, so a packet
    id comes back for a new message only after the others have gone round; `size` recent
    deliveries (by packet id, topic and a digest of the payload) are far fewer, and a
    message that matches one of them is the same message again: dropped and counted."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._seen: collections.OrderedDict[tuple[int, str, bytes], None] = collections.OrderedDict()
        self.count = 0

    def again(self, mid: int, topic: str, payload: bytes) -> bool:
        """Whether this delivery is one the session had already; remembers it otherwise."""
        key = (mid, topic, hashlib.blake2b(payload, digest_size=16).digest())
        if key in self._seen:
            self.count += 1
            return True
        self._seen[key] = None
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return False


class _MqttLink:
    def __init__(
        self, client: aiomqtt.Client, publish_timeout: float | None, checked: _CheckedPublisher | None,
        redeliveries: Redeliveries | None,
    ) -> None:
        self._client = client
        self._publish_timeout = publish_timeout
        self._checked = checked
        self._redeliveries = redeliveries

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        if self._checked is not None:
            await self._checked.publish(topic, payload)
            return
        try:
            await self._client.publish(topic, payload, qos=qos, retain=retain, timeout=self._publish_timeout)
        except (aiomqtt.MqttError, BaseExceptionGroup) as exc:
            error = mqtt_error(exc)
            if error is None:
                raise
            raise LinkLost(topic, error) from exc

    async def subscribe(self, filters: Sequence[str]) -> None:
        for i in range(0, len(filters), _SUBSCRIBE_CHUNK):
            await self._client.subscribe([(f, 1) for f in filters[i : i + _SUBSCRIBE_CHUNK]])

    async def messages(self) -> AsyncIterator[tuple[str, bytes, bool]]:
        again = self._redeliveries
        async for message in self._client.messages:
            payload = message.payload
            # paho hands every received payload over as bytes; anything else is junk the receiver counts
            data = bytes(payload) if isinstance(payload, bytes | bytearray) else b""
            topic = message.topic.value
            if again is not None and message.qos > 0 and again.again(message.mid, topic, data):
                continue  # sent again after a lost connection: it was delivered once already
            yield topic, data, bool(message.retain)


class ClientOptions(NamedTuple):
    """How an MQTT client of a transport connects.

    `identifier`: the MQTT client id (None: the library's). `keep_session` (MQTT 5): one
    session for the transport's life, taken up again by each new connection, so a QoS 1
    message the broker had sent on a lost connection is sent again, not lost; the first
    connection starts clean, and another process never takes this one's session.
    `timeout`: seconds for the connection and, by default, for a publish's acknowledgement;
    `max_inflight`: publishes at once (the client's normal load).
    """

    protocol: Literal[5, 311] = 5
    identifier: str | None = None
    will: LastWill | None = None
    timeout: float = 10.0
    max_inflight: int | None = None
    keep_session: bool = False


_DEFAULT_CLIENT = ClientOptions()


class MqttTransport:
    """A connection over sim.mqtt: login, TLS, last will, reconnection with backoff.

    `client`: how each connection's client connects (protocol, id, last will, session).
    `publish_timeout`: how long a publish waits for its acknowledgement (None: the client's
    `timeout`; `math.inf`: until the connection is found dead). `check_refusals`: a publish
    the broker refuses (an MQTT 5 PUBACK with a failure code) is a BrokerError; publishes
    then go one at a time.
    """

    def __init__(
        self,
        address: BrokerAddress,
        *,
        name: str,
        policy: ReconnectPolicy,
        client: ClientOptions = _DEFAULT_CLIENT,
        publish_timeout: float | None = None,
        check_refusals: bool = False,
    ) -> None:
        self.address = address
        self._name = name
        self._policy = policy
        self._options = client
        self._publish_timeout = publish_timeout
        self._check_refusals = check_refusals
        keep = client.keep_session
        self._identifier = f"npcsim-{secrets.token_hex(8)}" if client.identifier is None and keep else client.identifier
        self._connected = False
        self.redeliveries: Redeliveries | None = Redeliveries() if keep else None
        """With a kept session, what it was delivered lately: `redeliveries.count` messages were
        sent again after a lost connection and dropped (each delivered once)."""

    def _client(self) -> aiomqtt.Client:
        options = self._options
        will = None if options.will is None else aiomqtt.Will(options.will.topic, options.will.payload, qos=1,
                                                              retain=options.will.retain)
        return open_client(
            self.address, protocol=options.protocol, will=will, timeout=options.timeout,
            max_inflight=options.max_inflight, identifier=self._identifier,
            session_expiry=SESSION_KEPT_S if options.keep_session else None,
            resume_session=options.keep_session and self._connected,
        )

    async def run(self, session: Session, *, on_lost: Callable[[], None] | None = None) -> None:
        async def on_client(client: aiomqtt.Client) -> None:
            self._connected = True
            checked = _CheckedPublisher(client, self._name) if self._check_refusals else None
            await session(_MqttLink(client, self._publish_timeout, checked, self.redeliveries))

        await stay_connected(
            self.address, on_client, name=self._name, policy=self._policy, connect=self._client, on_lost=on_lost
        )


class _CheckedPublisher:
    """Publishes on `client` (which nobody else publishes on) and raises BrokerError when the
    broker refuses the publish, not only when it cannot be sent.

    aiomqtt waits for a QoS 1 publish's PUBACK but drops its reason code, and an MQTT 5
    broker answers a publish its ACL refuses with a PUBACK "Not authorized" (Mosquitto 2
    does): the publish returns as if it had been taken. This sees the reason code by
    wrapping the client's PUBACK callback (aiomqtt's paho client, `Client._client`: there is
    no public way; tests/test_view_access.py pins it against a real Mosquitto with the
    shipped ACL) and publishes one message at a time, so the PUBACK it sees is its own.
    Under MQTT 3.1.1 a PUBACK carries no reason code: a refusal cannot be seen there.
    """

    def __init__(self, client: aiomqtt.Client, name: str) -> None:
        self._client = client
        self._name = name
        self._lock = asyncio.Lock()
        self._ack: Any = None
        paho = client._client
        forward: Any = paho.on_publish  # aiomqtt's own callback (paho's v2 signature)

        def on_publish(paho_client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
            self._ack = reason_code
            forward(paho_client, userdata, mid, reason_code, properties)

        paho.on_publish = on_publish

    async def publish(self, topic: str, payload: bytes) -> None:
        """Publish at QoS 1; BrokerError when it cannot be sent or the broker refuses it."""
        async with self._lock:
            self._ack = None
            try:
                await self._client.publish(topic, payload, qos=1)
            except aiomqtt.MqttError as exc:
                raise BrokerError(f"{self._name}: publishing on {topic} failed: {exc}") from exc
            ack = self._ack
        if getattr(ack, "is_failure", False):
            raise BrokerError(f"{self._name}: the broker refused the publish on {topic}: {ack}")
