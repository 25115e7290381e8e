"""A publish that fails when the broker refuses it, not only when it cannot be sent.

aiomqtt waits for a QoS 1 publish's PUBACK but drops its reason code, and an MQTT 5 broker
answers a publish its ACL refuses with a PUBACK "Not authorized" (Mosquitto 2 does): the
publish returns as if it had been taken. `CheckedPublisher` sees the reason code by
wrapping the client's PUBACK callback (aiomqtt's paho client, `Client._client`: there is no
public way; tests/test_view_access.py pins it against a real Mosquitto with the shipped
ACL) and publishes one message at a time, so the PUBACK it sees is its own. Under MQTT
3.1.1 a PUBACK carries no reason code: a refusal cannot be seen there.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiomqtt

from sim.errors import BrokerError

__all__ = ["CheckedPublisher"]


class CheckedPublisher:
    """Publishes on `client` (which nobody else publishes on) and raises BrokerError when refused."""

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
