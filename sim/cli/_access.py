"""`npcsim subscribe --check`: which public channels a login may publish, asked of the broker itself.

A game that connects with the wrong login (or none) publishes the game system's topics and
hears nothing back: under MQTT 3.1.1 the broker drops a publish its ACL refuses in silence.
This asks: it connects with MQTT 5 and publishes one empty message at QoS 1 on each
public channel of the contract (sim.wire.contract), whose PUBACK says "Not authorized"
when the ACL refuses it. It publishes under a run id no run has (`npcsim-check-...`), so no
run ever takes a probe, and as the player its login names (a player may speak only as
itself). Reading cannot be asked this way (Mosquitto grants every subscription and filters
what it delivers), so what a login may read is the contract's word.
"""

from __future__ import annotations

import secrets

from sim.cli._terminal import Out
from sim.errors import BrokerError
from sim.mqtt import BrokerAddress, Link, MqttTransport, ReconnectPolicy
from sim.wire.contract import CHANNELS
from sim.wire.events import is_name

__all__ = ["check_access"]

_PROBE = "npcsim-check"


async def check_access(address: BrokerAddress, out: Out) -> None:
    """Print, for each public channel, whether `address`'s login may publish it and who the contract says does."""
    run = f"{_PROBE}-{secrets.token_hex(3)}"
    player = address.username if address.username and is_name(address.username) else _PROBE
    values = {"run": run, "player": player, "agent": _PROBE, "shard": "0", "location": _PROBE}
    rows: list[tuple[str, str, str, str]] = []

    async def session(link: Link) -> None:
        for channel in CHANNELS:
            topic = channel.topic(*(values[name] for name in channel.parameters))
            try:
                await link.publish(topic, b"", qos=1, retain=False)
                verdict = "yes"
            except BrokerError as exc:
                verdict = f"refused ({str(exc).rpartition(': ')[2]})"
            rows.append((channel.name, channel.address, ", ".join(r.name for r in channel.publishers), verdict))

    transport = MqttTransport(address, name="check", policy=ReconnectPolicy(patience=10), check_refusals=True)
    await transport.run(session)
    login = address.username or "anonymous"
    out.record(f"{login} on {address.url}: what it may publish, asked of the broker (MQTT 5, QoS 1, run {run})")
    out.table(("channel", "topic", "published by (the contract)", f"{login} may publish"), rows)
