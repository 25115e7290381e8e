"""The bus against a real Mosquitto: batching, de-duplication, malformed payloads, outages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiomqtt
import pytest

from sim.bus import BusConfig, open_bus
from sim.errors import BrokerError, OutboxFullError
from sim.mqtt import BrokerAddress, ReconnectPolicy
from sim.wire import topics
from sim.wire.events import EventBatch, Speech, encode_batch
from tests.conftest import MosquittoProcess, free_port

pytestmark = pytest.mark.mosquitto
FAST = ReconnectPolicy(initial=0.05, maximum=0.2)


def speech(n: int, tick: int = 0) -> Speech:
    return Speech(id=f"r:a:{tick}:{n}", tick=tick, location="sq", speaker="a", text=f"line {n}")


async def wait_for(condition: Callable[[], object], steps: int = 500) -> None:
    """Poll a counter the bus updates, for at most `steps` x 10 ms."""
    for _ in range(steps):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


async def test_batch_round_trip(mosquitto: MosquittoProcess) -> None:
    async with open_bus(BusConfig(broker=mosquitto.address, run="r")) as bus:
        await bus.listen_location("sq", ["b", "c"])
        topic = topics.location_events("r", "sq")
        for n in (2, 1, 3):
            bus.emit(topic, speech(n))
        assert [(t, n) for t, _, n in await bus.flush(0)] == [(topic, 3)]
        async with asyncio.timeout(5):
            await bus.wait_for(lambda: len(bus.mailbox("c")) == 3)
        assert [e.text for e in bus.mailbox("b").drain()] == ["line 1", "line 2", "line 3"]
        assert len(bus.mailbox("c")) == 3
        assert bus.stats.messages_in == 1


async def test_redelivered_events_are_applied_once(mosquitto: MosquittoProcess) -> None:
    async with open_bus(BusConfig(broker=mosquitto.address, run="r")) as bus:
        await bus.listen_location("sq", ["b"])
        payload = encode_batch(EventBatch(shard="other", tick=0, events=(speech(1), speech(2))))
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            for _ in range(3):
                await client.publish(topics.location_events("r", "sq"), payload, qos=1)
        await wait_for(lambda: bus.stats.messages_in == 3)
        assert len(bus.mailbox("b")) == 2
        assert bus.stats.duplicates == 4


async def test_malformed_payloads_are_counted_and_dropped(mosquitto: MosquittoProcess) -> None:
    inputs = []
    async with open_bus(BusConfig(broker=mosquitto.address, run="r")) as bus:
        await bus.listen_location("sq", ["b"])
        await bus.listen_inboxes(["b"])
        await bus.listen_player_input(lambda player, msg: inputs.append((player, msg.to)))
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            for topic in (
                topics.location_events("r", "sq"),
                topics.agent_inbox("r", "b"),
                topics.player_input("r", "p"),
            ):
                for junk in (b"", b"\xc1\xff", b'{"to": 3}', b"[1,2,3]"):
                    await client.publish(topic, junk, qos=1)
            await client.publish(topics.player_input("r", "p"), b'{"to": "b", "text": "hi"}', qos=1)
        await wait_for(lambda: inputs)
        assert inputs == [("p", "b")]
        assert bus.stats.malformed == {"location events": 4, "inbox": 4, "player input": 4}
        assert len(bus.mailbox("b")) == 0


async def test_outbox_full_during_outage_raises(mosquitto: MosquittoProcess) -> None:
    config = BusConfig(broker=mosquitto.address, run="r", outbox_size=3, reconnect=FAST)
    async with open_bus(config) as bus:
        mosquitto.stop()
        await wait_for(lambda: not bus._connected.is_set())
        for n in range(3):
            await bus.publish("npcsim/r/x", b"%d" % n)
        with pytest.raises(OutboxFullError, match="outbox full"):
            await bus.publish("npcsim/r/x", b"lost")
        mosquitto.start()
        async with asyncio.timeout(10):
            await bus.wait_sent()
        assert bus.stats.messages_out >= 3


async def test_reconnects_and_resubscribes(mosquitto: MosquittoProcess) -> None:
    config = BusConfig(broker=mosquitto.address, run="r", reconnect=FAST)
    async with open_bus(config) as bus:
        await bus.listen_location("sq", ["b"])
        mosquitto.stop()
        await wait_for(lambda: not bus._connected.is_set())
        bus.emit(topics.location_events("r", "sq"), speech(1))
        await bus.flush(0)
        mosquitto.start()
        async with asyncio.timeout(10):
            await bus.wait_for(lambda: len(bus.mailbox("b")) == 1)
        assert bus.stats.reconnects >= 1


async def test_unreachable_broker_is_a_clear_error() -> None:
    unreachable = BrokerAddress(host="127.0.0.1", port=free_port())
    config = BusConfig(broker=unreachable, run="r", reconnect=ReconnectPolicy(initial=0.01, patience=0.2))
    with pytest.raises(BrokerError, match="no MQTT connection"):
        async with open_bus(config):
            pass
