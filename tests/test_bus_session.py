"""A message the broker sent on a connection that was then reset reaches the bus after it reconnects.

Found by the fault harness (seed 96 of `make faults SEEDS=51-100 FAULTS_ARGS="--world generated
--shards 3"`): two players' inputs, acknowledged to their publisher, were on their way to shard 1
when its connection was reset; the bus reconnected with a clean session, and the broker dropped
them. The bus now keeps one MQTT 5 session for its life (sim.mqtt.MqttTransport) and takes it up
again on reconnection, so the broker sends them again.

Here the link between the bus and a real Mosquitto runs through the harness's fault proxy:
the proxy holds every byte, a player's input is published (the broker sends it into the held
link), the link is reset with an RST, and then released.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiomqtt
import pytest

from sim.bus import Bus, BusConfig, open_bus
from sim.mqtt import BrokerAddress
from sim.protocol.received import OutsideReceived
from sim.wire import topics
from sim.wire.events import PlayerInputMessage
from tests.faults.network import FaultProxy, fault_proxy
from tests.helpers import MosquittoProcess, eventually

pytestmark = pytest.mark.timeout(60)


async def _publish_input(port: int, player: str, text: str) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as client:
        await client.publish(topics.player_input("r1", player), json.dumps({"to": "n1", "text": text}), qos=1)


async def _inputs(bus: Bus, into: list[str]) -> bool:
    into += [e.message.text for e in bus.take_events()
             if isinstance(e, OutsideReceived) and isinstance(e.message, PlayerInputMessage)]
    return bool(into)


@pytest.fixture
async def proxy(mosquitto: MosquittoProcess) -> AsyncIterator[FaultProxy]:
    async with fault_proxy(mosquitto.port) as held:
        yield held


async def test_an_input_in_flight_when_the_connection_is_reset_arrives_after_reconnecting(
    mosquitto: MosquittoProcess, proxy: FaultProxy
) -> None:
    config = BusConfig(broker=BrokerAddress(host="127.0.0.1", port=proxy.port), run="r1", shard="1")
    async with open_bus(config) as bus:
        await bus.listen("player-input")
        got: list[str] = []
        await _publish_input(mosquitto.port, "p1", "before")
        await eventually(lambda: _inputs(bus, got), what="the first input")
        assert got == ["before"]

        held = asyncio.create_task(proxy.stall(1.0))
        await _publish_input(mosquitto.port, "p1", "in flight")  # acknowledged by the broker
        await eventually(lambda: proxy.held, what="the broker sending it into the held link")
        proxy.reset()
        await held
        got.clear()
        await eventually(lambda: _inputs(bus, got), what="the input sent on the reset connection", within=10)
        assert got == ["in flight"]
        assert bus.stats.reconnects == 1


async def test_an_input_the_broker_sends_again_after_a_reset_is_taken_once(
    mosquitto: MosquittoProcess, proxy: FaultProxy
) -> None:
    """At least once: the bus received the input, its acknowledgement never reached the broker
    (held, then the link reset), so the broker sends it again on the session's next connection.
    The redelivery is recognised by the session's packet id and dropped, counted."""
    config = BusConfig(broker=BrokerAddress(host="127.0.0.1", port=proxy.port), run="r1", shard="1")
    async with open_bus(config) as bus:
        await bus.listen("player-input")
        got: list[str] = []
        proxy.hold_upward = True  # the bus's PUBACK is held from here on
        await _publish_input(mosquitto.port, "p1", "once")
        await eventually(lambda: _inputs(bus, got), what="the input")
        await eventually(lambda: proxy.held, what="the acknowledgement held")
        proxy.reset()
        proxy.hold_upward = False

        async def recognised() -> bool:
            await _inputs(bus, got)  # whatever arrives is kept: a copy taken again would show in `got`
            return bus.stats.reconnects == 1 and bus.stats.redelivered == 1

        await eventually(recognised, what="the redelivery recognised", within=10)
        await _publish_input(mosquitto.port, "p1", "after")
        later: list[str] = []
        await eventually(lambda: _inputs(bus, later), what="the next input")
        assert (got, later) == (["once"], ["after"])  # taken once: the copy sent again never reached the shard


async def test_a_new_bus_does_not_take_up_another_bus_session(mosquitto: MosquittoProcess) -> None:
    """Each process's bus has a session of its own: a second one never takes the first one's place."""
    config = BusConfig(broker=BrokerAddress(host="127.0.0.1", port=mosquitto.port), run="r1", shard="1")
    async with open_bus(config) as first, open_bus(config) as second:
        await first.listen("player-input")
        await second.listen("player-input")
        await _publish_input(mosquitto.port, "p1", "both")
        got_first: list[str] = []
        got_second: list[str] = []
        await eventually(lambda: _inputs(first, got_first), what="the input at the first bus")
        await eventually(lambda: _inputs(second, got_second), what="the input at the second bus")
        assert got_first == got_second == ["both"]
        assert first.stats.reconnects == second.stats.reconnects == 0
