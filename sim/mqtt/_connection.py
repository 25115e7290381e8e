"""Clients and the one reconnect policy every npcsim MQTT client follows.

    async with open_client(address, identifier="viewer-1") as client:   # one connection
        ...

    async def session(client: aiomqtt.Client) -> None:                  # a connection that lasts
        await client.subscribe(topic)
        async for message in client.messages: ...

    await stay_connected(address, session, name="viewer", policy=ReconnectPolicy())

`stay_connected` runs `session` on a fresh connection, and again after each loss: the
wait between attempts is a jittered exponential backoff that starts over after every
successful connection. It logs one warning when the connection is lost (or cannot be made)
and one when it is back. After `policy.patience` seconds without a connection it raises a
one-line BrokerError; a login the broker refuses (bad user name or password, not
authorized) and a broker certificate that TLS does not accept are BrokerErrors at once,
since retrying cannot fix them. Every message names
the broker by `address.url`, which never holds the password.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sim.backoff import Backoff, BackoffPolicy
from sim.errors import BrokerError
from sim.mqtt._address import BrokerAddress, redact

__all__ = [
    "LinkLost", "ReconnectPolicy", "login_refused", "mqtt_error", "open_client", "refused_error", "stay_connected",
]

log = logging.getLogger(__name__)
# aiomqtt warns for every publish beyond its threshold in flight; npcsim clients keep many in
# flight on purpose, so only the library's errors are shown.
_library_log = logging.getLogger("sim.mqtt.aiomqtt")
_library_log.setLevel(logging.ERROR)

# CONNACK codes that mean "your login is refused": MQTT 3.1.1 (4, 5) and MQTT 5 (134, 135).
_LOGIN_REFUSED = frozenset({4, 5, 134, 135})
_CERTIFICATE_REFUSED = "certificate verify failed"


class ReconnectPolicy(BackoffPolicy, frozen=True, kw_only=True):
    """Backoff between attempts (seconds) and how long to go on without a connection.

    `patience=None` means forever (a worker waits for its broker however long it takes).
    """

    patience: float | None = 30.0


class LinkLost(BrokerError):
    """A publish failed because its connection went; raised out of a session, `stay_connected`
    connects again as for any lost connection."""

    def __init__(self, topic: str, error: aiomqtt.MqttError) -> None:
        super().__init__(f"publishing to {topic} failed: {redact(str(error))}")
        self.error = error


def open_client(
    address: BrokerAddress,
    *,
    identifier: str | None = None,
    protocol: Literal[5, 311] = 5,
    will: aiomqtt.Will | None = None,
    keepalive: int = 30,
    timeout: float = 10.0,
    max_inflight: int | None = None,
    session_expiry: int | None = None,
    resume_session: bool = False,
) -> aiomqtt.Client:
    """An aiomqtt client for `address` (login and TLS included); use it with `async with`.

    Incoming messages queue without a bound inside the client: callers bound their own
    work instead. `max_inflight` publishes at once are this client's normal load.
    `session_expiry` (MQTT 5, with a fixed `identifier`): the broker keeps the session that
    many seconds after the connection ends, and a connection with `resume_session` takes up
    the one kept (its subscriptions, and the QoS 1 messages sent on the lost connection but
    never acknowledged, or queued since). None: the session ends with the connection.
    """
    tls = None
    if address.tls:
        files = address.tls_files
        tls = aiomqtt.TLSParameters(ca_certs=files.ca_file, certfile=files.cert_file, keyfile=files.key_file)
    client = aiomqtt.Client(
        address.host,
        address.port,
        username=address.username,
        password=address.password,
        identifier=identifier,
        protocol=aiomqtt.ProtocolVersion.V5 if protocol == 5 else aiomqtt.ProtocolVersion.V311,
        will=will,
        keepalive=keepalive,
        timeout=timeout,
        logger=_library_log,
        tls_params=tls,
        max_inflight_messages=max_inflight,
        max_queued_incoming_messages=0,
        **_session_options(protocol, session_expiry, resume=resume_session),
    )
    if max_inflight is not None:
        client.pending_calls_threshold = max_inflight
    return client


def _session_options(protocol: Literal[5, 311], expiry: int | None, *, resume: bool) -> dict[str, Any]:
    if expiry is None or protocol != 5:
        return {}
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]  # paho has no hints here
    properties.SessionExpiryInterval = expiry
    return {"clean_start": not resume, "properties": properties}


def mqtt_error(exc: BaseException) -> aiomqtt.MqttError | None:
    """The MQTT error behind `exc` (itself, a lost link's, or the only kind inside a task group's error)."""
    if isinstance(exc, aiomqtt.MqttError):
        return exc
    if isinstance(exc, LinkLost):
        return exc.error
    if isinstance(exc, BaseExceptionGroup):
        inner = [mqtt_error(e) for e in exc.exceptions]
        if inner and all(e is not None for e in inner):
            return inner[0]
    return None


def login_refused(exc: aiomqtt.MqttError) -> bool:
    """The broker refused the login: retrying with the same credentials cannot succeed."""
    rc = getattr(exc, "rc", None)
    value = getattr(rc, "value", rc)
    return isinstance(exc, MqttConnectError) and value in _LOGIN_REFUSED


def refused_error(address: BrokerAddress, name: str, exc: aiomqtt.MqttError) -> BrokerError:
    who = f"user {address.username!r}" if address.username else "an anonymous client"
    return BrokerError(
        f"{name}: the broker at {address.url} refused the login of {who} ({exc}); check the user name and "
        f"password (URL user part, or NPCSIM_MQTT_USERNAME / NPCSIM_MQTT_PASSWORD)"
    )


async def stay_connected(
    address: BrokerAddress,
    session: Callable[[aiomqtt.Client], Awaitable[None]],
    *,
    name: str,
    policy: ReconnectPolicy,
    connect: Callable[[], aiomqtt.Client] | None = None,
    on_lost: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run `session(client)` on a connection, reconnecting per `policy` until it returns.

    `connect` makes the client (default: `open_client(address)`); `on_lost` is called each
    time a connection ends or an attempt fails, before the backoff. Errors other than
    aiomqtt's propagate unchanged; CancelledError is never swallowed.
    """
    make = connect or (lambda: open_client(address))
    backoff = Backoff(policy)
    down_since: float | None = None
    ever_connected = False
    while True:
        try:
            async with make() as client:
                if down_since is not None and ever_connected:
                    log.warning("%s: MQTT connection to %s is back after %.1f s", name, address.url,
                                clock() - down_since)
                ever_connected = True
                down_since = None
                backoff.reset()
                await session(client)
                return
        except (aiomqtt.MqttError, LinkLost, BaseExceptionGroup) as exc:
            error = mqtt_error(exc)
            if error is None:
                raise
            if login_refused(error):
                raise refused_error(address, name, error) from None
            if _CERTIFICATE_REFUSED in str(error).lower():
                raise BrokerError(
                    f"{name}: TLS did not accept the certificate of the broker at {address.url} ({error}); "
                    f"check --ca-file"
                ) from None
            if on_lost is not None:
                on_lost()
            now = clock()
            if down_since is None:
                down_since = now
                what = "lost" if ever_connected else "cannot be made"
                log.warning("%s: MQTT connection to %s %s (%s); retrying with backoff", name, address.url, what,
                            redact(str(error)))
            if policy.patience is not None and now - down_since >= policy.patience:
                raise BrokerError(
                    f"{name}: no MQTT connection to {address.url} for {policy.patience:g} s: {redact(str(error))}"
                ) from None
            await asyncio.sleep(backoff.next())
