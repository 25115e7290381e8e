"""The shard's MQTT bus: one connection, the QoS 1 outbox, and the routing it feeds.

    async with open_bus(BusConfig(broker=BrokerAddress.parse(url), run="r1", shard="0")) as bus:
        await bus.listen_places({"forge": 1, "inn": 0})    # every place, with its NPCs here
        bus.deliver(topic, events)        # for its own places and NPCs: no broker, no echo
        await bus.publish(topic, payload) # for another shard's
        events = bus.take_events()        # what the shard acts on; its places' events and mail wait in the bus

A shard delivers what it emits for its own places and NPCs itself; only what another
shard takes travels through the broker, and a tick's events are perceived at the next tick
once the tick barrier (sim.protocol.barrier) says that every batch of the tick a peer sent
has arrived. Places' events and mail are handed over sorted by (tick, id), so asyncio's
scheduling order and the broker's interleaving of topics never reach the results.

The protocol logic is sans-I/O (sim.protocol); the bus is the loop around it, and reaches
the broker through a `sim.mqtt.Transport` (MQTT by default; `sim.mqtt.LocalBroker` connects
the buses of one process without a broker).
"""

from sim.bus._endpoint import Bus, BusConfig, BusEvent, Connected, open_bus
from sim.protocol.mailbox import Mailbox
from sim.protocol.router import BusStats

__all__ = [
    "Bus",
    "BusConfig",
    "BusEvent",
    "BusStats",
    "Connected",
    "Mailbox",
    "open_bus",
]
