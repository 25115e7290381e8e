"""npcsim's one MQTT connection layer: the broker address, clients, the reconnect policy.

    from sim.mqtt import BrokerAddress, ReconnectPolicy, open_client, stay_connected

    address = BrokerAddress.parse(url)             # mqtt[s]://[user[:pw]@]host[:port] + env + TLS
    async with open_client(address, identifier="view-1") as client: ...
    await stay_connected(address, session, name="view", policy=ReconnectPolicy())

Every component (bus, inference pool, worker, `subscribe`, load test) connects through
here, so login, TLS, reconnection and the redaction of passwords are the same everywhere.
`CheckedPublisher` publishes so that a broker's refusal is an error (the view's speaking).
"""

from sim.backoff import Backoff
from sim.mqtt._address import ENV_PASSWORD, ENV_USERNAME, BrokerAddress, TlsFiles, redact
from sim.mqtt._checked import CheckedPublisher
from sim.mqtt._connection import ReconnectPolicy, mqtt_error, open_client, stay_connected

__all__ = [
    "ENV_PASSWORD",
    "ENV_USERNAME",
    "Backoff",
    "BrokerAddress",
    "CheckedPublisher",
    "ReconnectPolicy",
    "TlsFiles",
    "mqtt_error",
    "open_client",
    "redact",
    "stay_connected",
]
