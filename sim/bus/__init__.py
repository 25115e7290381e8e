"""The shard's MQTT bus: one connection, the QoS 1 outbox, and the routing it feeds.

    async with open_bus(BusConfig(broker=BrokerAddress.parse(url), run="r1", shard="0")) as bus:
        await bus.listen_location("forge", ["blacksmith"])
        await bus.publish(topic, payload)
        events = bus.take_events()        # what the shard acts on; mail is in bus.mailbox(agent)

Every event, local or not, travels through the broker, and a tick's events are perceived
at the next tick once the tick barrier (sim.protocol.barrier) says that every batch of the
tick has arrived. The agents then drain their mailboxes sorted by (tick, id), so asyncio's
scheduling order and the broker's interleaving of topics never reach the results.

The protocol logic is sans-I/O (sim.protocol); the bus is the loop around it, and reaches
the broker through a `Transport` (MQTT through sim.mqtt by default).
"""

from sim.bus._bus import Bus, BusConfig, BusEvent, Connected, open_bus
from sim.bus._transport import Link, MqttTransport, Transport
from sim.protocol.mailbox import Mailbox
from sim.protocol.router import BusStats

__all__ = [
    "Bus",
    "BusConfig",
    "BusEvent",
    "BusStats",
    "Connected",
    "Link",
    "Mailbox",
    "MqttTransport",
    "Transport",
    "open_bus",
]
