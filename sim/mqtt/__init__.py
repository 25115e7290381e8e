"""npcsim's one MQTT connection layer: the broker address, the transport seam, reconnection.

    from sim.mqtt import BrokerAddress, MqttTransport, ReconnectPolicy

    address = BrokerAddress.parse(url)             # mqtt[s]://[user[:pw]@]host[:port] + env + TLS
    transport = MqttTransport(address, name="view", policy=ReconnectPolicy())

    async def session(link: Link) -> None:         # on every (re)connection
        await link.subscribe([topic])
        async for topic, payload, retained in link.messages(): ...

    await transport.run(session)

Every component (bus, run-nonce handshake, inference pool and worker, `subscribe`, the
live view) connects through a `Transport`, so login, TLS, reconnection and the redaction
of passwords are the same everywhere, and a `LocalBroker` can stand in for the broker. Only
this package imports aiomqtt; `open_client` and `stay_connected` are the layer under the
transport (an aiomqtt client, and the one reconnect loop).
"""

from sim.backoff import Backoff
from sim.mqtt._address import ENV_PASSWORD, ENV_USERNAME, BrokerAddress, TlsFiles, redact
from sim.mqtt._connection import ReconnectPolicy, open_client, stay_connected
from sim.mqtt._local import LocalBroker
from sim.mqtt._transport import ClientOptions, LastWill, Link, MqttTransport, Transport, topic_matches

__all__ = [
    "ENV_PASSWORD",
    "ENV_USERNAME",
    "Backoff",
    "BrokerAddress",
    "ClientOptions",
    "LastWill",
    "Link",
    "LocalBroker",
    "MqttTransport",
    "ReconnectPolicy",
    "TlsFiles",
    "Transport",
    "open_client",
    "redact",
    "stay_connected",
    "topic_matches",
]
