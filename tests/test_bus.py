"""The bus against a real Mosquitto: batches, de-duplication, malformed payloads, events, outages."""

from __future__ import annotations

import asyncio

import aiomqtt
import pytest

from sim.bus import Bus, BusConfig, Connected, open_bus
from sim.errors import BrokerError, OutboxFullError
from sim.memory import NpcState, WorkingMemoryConfig, build_working_memory
from sim.mqtt import BrokerAddress, ReconnectPolicy
from sim.protocol.outbox import Outbox
from sim.protocol.received import BatchArrived, InputRefused, OutsideReceived
from sim.wire import topics
from sim.wire.events import EventBatch, PlayerInputMessage, Speech, encode_batch
from sim.wire.trace import TraceMessage, decode_traces, encode_trace
from tests.helpers import MosquittoProcess, elapse, eventually, free_port

pytestmark = pytest.mark.mosquitto
FAST = ReconnectPolicy(initial=0.05, maximum=0.2)


def speech(n: int, tick: int = 0) -> Speech:
    return Speech(id=f"r:a:{tick}:{n}", tick=tick, location="sq", speaker="a", text=f"line {n}")


async def send(bus: Bus, outbox: Outbox, tick: int) -> list[tuple[str, int]]:
    """What the shard's publish phase does with the tick's outbox."""
    batches = outbox.flush(tick)
    for batch in batches:
        await bus.publish(batch.topic, batch.payload)
    return [(b.topic, b.events) for b in batches]


async def test_batch_round_trip(mosquitto: MosquittoProcess) -> None:
    async with open_bus(BusConfig(broker=mosquitto.address, run="r")) as bus:
        await bus.listen_places({"sq": 2})
        topic = topics.location_events("r", "sq")
        outbox = Outbox("0")
        for n in (2, 1, 3):
            outbox.emit(topic, speech(n))
        assert await send(bus, outbox, 0) == [(topic, 3)]
        await eventually(lambda: bus.stats.messages_in == 1, what="the batch")
        assert bus.arrived.is_set()
        assert bus.take_events() == [Connected(again=False), BatchArrived("0", 0, topic, 3)]
        assert not bus.arrived.is_set() and bus.take_events() == []
        [(place, events)] = bus.mail.take_place_events(0)  # once for the place, whoever listens there
        assert place == "sq" and [e.text for e in events] == ["line 1", "line 2", "line 3"]
        assert bus.stats.events_delivered == 6 and bus.mail.take_place_events(0) == []


async def test_redelivered_events_are_applied_once(mosquitto: MosquittoProcess) -> None:
    async with open_bus(BusConfig(broker=mosquitto.address, run="r")) as bus:
        await bus.listen_places({"sq": 1})
        payload = encode_batch(EventBatch(shard="other", tick=0, events=(speech(1), speech(2))))
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            for _ in range(3):
                await client.publish(topics.location_events("r", "sq"), payload, qos=1)
        await eventually(lambda: bus.stats.messages_in == 3, what="the three deliveries")
        assert [len(events) for _, events in bus.mail.take_place_events(0)] == [2]
        assert bus.stats.duplicates == 4


async def test_malformed_payloads_are_counted_and_dropped(mosquitto: MosquittoProcess) -> None:
    async with open_bus(BusConfig(broker=mosquitto.address, run="r")) as bus:
        await bus.listen_places({"sq": 1})
        await bus.listen_inboxes(["b"])
        await bus.listen("player-input")
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            for topic in (
                topics.location_events("r", "sq"),
                topics.agent_inbox("r", "b"),
                topics.player_input("r", "p"),
            ):
                for junk in (b"", b"\xc1\xff", b'{"to": 3}', b"[1,2,3]"):
                    await client.publish(topic, junk, qos=1)
            await client.publish(topics.player_input("r", "p"), b'{"to": "b", "text": "hi"}', qos=1)
        await eventually(lambda: bus.stats.messages_in == 13, what="the 13 messages")
        inputs = [e for e in bus.take_events() if not isinstance(e, Connected)]
        assert inputs[-1] == OutsideReceived("player-input", "p", PlayerInputMessage(to="b", text="hi"))
        # each refused input is handed on to be answered on the player's error topic; an empty
        # payload is how MQTT clears a retained message: counted, never answered
        refused = [e for e in inputs[:-1] if isinstance(e, InputRefused)]
        assert len(refused) == len(inputs) - 1 == 3
        assert [e.error.code for e in refused] == ["not_json", "schema", "schema"]
        assert {e.player for e in refused} == {"p"}
        assert bus.stats.malformed == {"location events": 4, "inbox": 4, "player input": 3}
        assert bus.stats.refused == {"empty player message (a retained one cleared)": 1}
        assert len(bus.mail.mailbox("b")) == 0


async def test_outbox_full_during_outage_raises(mosquitto: MosquittoProcess) -> None:
    config = BusConfig(broker=mosquitto.address, run="r", outbox_size=3, reconnect=FAST)
    async with open_bus(config) as bus:
        mosquitto.stop()
        await eventually(lambda: not bus.connected, what="the bus seeing the broker gone")
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
        await bus.listen_places({"sq": 1})
        mosquitto.stop()
        await eventually(lambda: not bus.connected, what="the bus seeing the broker gone")
        outbox = Outbox("0")
        outbox.emit(topics.location_events("r", "sq"), speech(1))
        await send(bus, outbox, 0)
        mosquitto.start()
        await eventually(lambda: bus.stats.messages_in == 1, what="the batch sent during the outage")
        assert [len(events) for _, events in bus.mail.take_place_events(0)] == [1]
        assert bus.stats.reconnects >= 1
        assert [e for e in bus.take_events() if isinstance(e, Connected)][:2] == [
            Connected(again=False), Connected(again=True)
        ]


async def test_unreachable_broker_is_a_clear_error() -> None:
    unreachable = BrokerAddress(host="127.0.0.1", port=free_port())
    config = BusConfig(broker=unreachable, run="r", reconnect=ReconnectPolicy(initial=0.01, patience=0.2))
    with pytest.raises(BrokerError, match="no MQTT connection"):
        async with open_bus(config):
            pass


class _HeldLink:
    """A link whose publishes wait for the test to acknowledge them, in any order."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.acks: dict[str, asyncio.Event] = {}

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        self.started.append(topic)
        self.acks[topic] = asyncio.Event()
        await self.acks[topic].wait()

    async def subscribe(self, filters: object) -> None:
        return None

    async def messages(self):  # type: ignore[no-untyped-def]
        await asyncio.Event().wait()
        yield ("", b"", False)


class _HeldTransport:
    def __init__(self, link: _HeldLink) -> None:
        self.link = link

    async def run(self, session, *, on_lost):  # type: ignore[no-untyped-def]
        await session(self.link)


async def test_publishes_wait_in_a_bounded_window_not_for_each_acknowledgement() -> None:
    link = _HeldLink()
    config = BusConfig(broker=BrokerAddress(), run="r", publish_window=4)
    async with open_bus(config, transport=_HeldTransport(link)) as bus:
        for n in range(10):
            await bus.publish(f"t{n}", b"x")
        await eventually(lambda: len(link.started) == 4, what="a full window of publishes")
        await elapse(0.05)  # the subject: a while with the window full, in which nothing more may start
        assert link.started == ["t0", "t1", "t2", "t3"]  # the window is full: nothing more is sent
        link.acks["t2"].set()  # any acknowledgement makes room for the next, not the whole window's
        await eventually(lambda: len(link.started) == 5, what="the publish the acknowledgement let in")
        assert link.started[-1] == "t4" and bus.stats.messages_out == 1
        for n in range(10):
            await eventually(lambda n=n: f"t{n}" in link.acks, what=f"publish t{n}")
            link.acks[f"t{n}"].set()
        await bus.wait_sent()
        assert link.started == [f"t{n}" for n in range(10)] and bus.stats.messages_out == 10


def _trace(n: int) -> TraceMessage:
    report = build_working_memory(NpcState(agent_id="a", system_prompt="You are a test."), "hi",
                                  WorkingMemoryConfig()).report
    return TraceMessage(run="r", shard="0", agent="a", location="sq", tick=0, inference_id=f"r:a:0:{n}",
                        player_input="hi", line=f"line {n}", fallback=False, fallback_reason=None,
                        backend="scripted", model="scripted", prompt_sha256="0" * 64, report=report, prompt="p" * n)


class _TraceListener:
    """A plain MQTT client on `trace/+`: each message's traces, as received."""

    def __init__(self, mosquitto: MosquittoProcess) -> None:
        self.port = mosquitto.port
        self.batches: list[list[str]] = []
        self.sizes: list[int] = []
        self.ready = asyncio.Event()

    @property
    def ids(self) -> list[str]:
        return [i for batch in self.batches for i in batch]

    async def listen(self) -> None:
        async with aiomqtt.Client("127.0.0.1", self.port) as client:
            await client.subscribe("npcsim/r/trace/+", qos=1)
            self.ready.set()
            async for message in client.messages:
                payload = bytes(message.payload)  # type: ignore[arg-type]
                self.sizes.append(len(payload))
                self.batches.append([t.inference_id for t in decode_traces(payload)])


async def test_traces_travel_in_batches_and_the_rest_goes_when_the_bus_closes(mosquitto: MosquittoProcess) -> None:
    listener = _TraceListener(mosquitto)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(listener.listen())
        await listener.ready.wait()
        config = BusConfig(broker=mosquitto.address, run="r", trace_batch=10, trace_linger=30.0)
        async with open_bus(config) as bus:
            for n in range(25):
                await bus.publish_trace(_trace(n))
            await eventually(lambda: len(listener.batches) == 2, what="the two full batches")
            await elapse(0.2)  # the subject: the last five wait for more (the linger is 30 s)
            assert [len(b) for b in listener.batches] == [10, 10] and bus.stats.messages_out == 2
        await eventually(lambda: len(listener.batches) == 3, what="the last batch, sent as the bus closed")
        task.cancel()
    assert listener.ids == [f"r:a:0:{n}" for n in range(25)]  # every trace once, in order


async def test_a_lone_trace_goes_after_the_linger(mosquitto: MosquittoProcess) -> None:
    listener = _TraceListener(mosquitto)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(listener.listen())
        await listener.ready.wait()
        async with open_bus(BusConfig(broker=mosquitto.address, run="r", trace_linger=0.05)) as bus:
            await bus.publish_trace(_trace(1))
            await eventually(lambda: listener.batches == [["r:a:0:1"]], what="the trace, without another")
            await bus.publish_trace(_trace(2))
            await eventually(lambda: len(listener.batches) == 2, what="the next one, after its own linger")
        task.cancel()
    assert listener.batches == [["r:a:0:1"], ["r:a:0:2"]]


async def test_a_batch_stays_within_its_bytes_and_a_trace_over_them_goes_alone(mosquitto: MosquittoProcess) -> None:
    listener = _TraceListener(mosquitto)
    one = len(encode_trace(_trace(0)))
    limit = 4 * one + 2000
    async with asyncio.TaskGroup() as group:
        task = group.create_task(listener.listen())
        await listener.ready.wait()
        config = BusConfig(broker=mosquitto.address, run="r", trace_batch_bytes=limit, trace_linger=30.0)
        async with open_bus(config) as bus:
            for n in [*range(10), 3 * limit, 1]:  # traces of n characters of prompt; one alone is over the limit
                await bus.publish_trace(_trace(n))
        await eventually(lambda: len(listener.ids) == 12, what="every trace")
        task.cancel()
    assert listener.ids == [f"r:a:0:{n}" for n in [*range(10), 3 * limit, 1]]
    over = listener.batches.index([f"r:a:0:{3 * limit}"])  # alone in its message
    assert all(size <= limit for i, size in enumerate(listener.sizes) if i != over)
    assert len(listener.batches) < 12  # the small ones shared messages
