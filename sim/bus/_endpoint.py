"""The shard's bus: one connection, the QoS 1 outbox, and the router it feeds.

    async with open_bus(BusConfig(broker=BrokerAddress.parse(url), run="r1", shard="0")) as bus:
        await bus.listen_places({"forge": 1, "inn": 0})    # every place, with its NPCs here
        await bus.listen_inboxes(["blacksmith"])
        await bus.listen_barrier()
        await bus.listen("player-input")                  # a public channel (sim.wire.contract.CHANNELS)
        bus.deliver(topic, events)                        # one of its own places or NPCs: no broker
        await bus.send("say", say)                        # a public channel's message, on its topic
        await bus.publish(topic, payload)                 # queued, sent in order
        await clock.wait(bus.arrived, 0.5)                # something to act on came in
        for event in bus.take_events(): ...               # BatchArrived, OutsideReceived, ..., Connected
        bus.mail.take_place_events(tick)                  # the places' events, for their logs
        bus.mail.take_mail("blacksmith", tick)            # its inbox

What arrives is decided by `sim.protocol.router.Router` (sans-I/O: routes, intakes,
mailboxes, de-duplication, bounds): a place's events wait in its intake until the shard
appends them to the place's log, directed events in the addressee's mailbox, and what the
shard must act on (sim.protocol.received) waits in the bus's event queue, with a
`Connected` after each (re)connection, until the shard takes it at a phase boundary or in
the barrier wait. The connection is the `sim.mqtt.Transport`'s (MQTT by default).

Delivery is QoS 1 (at least once): publishes wait in the bus's outbox (sim.bus._sender)
while the broker is away and, when it is full, the caller gets OutboxFullError: a QoS 1
event is never dropped silently.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Literal

import msgspec

from sim.bus._sender import Outgoing, Sender
from sim.bus._traces import TraceBatches
from sim.errors import single_error
from sim.mqtt import BrokerAddress, ClientOptions, LastWill, Link, MqttTransport, ReconnectPolicy, Transport
from sim.protocol.bounds import ErrorReplies, InputBounds
from sim.protocol.received import OutsideReceived, Received
from sim.protocol.router import Router
from sim.protocol.seal import RunKey, seal
from sim.wire import topics
from sim.wire.barrier import BarrierMessage, encode_barrier
from sim.wire.contract import ChannelName, channel_named
from sim.wire.events import AnyEvent, ErrorMessage, StatusMessage, encode_json
from sim.wire.trace import TraceMessage, encode_trace

__all__ = ["Bus", "BusConfig", "BusEvent", "Connected", "open_bus"]

log = logging.getLogger(__name__)

_SPOKEN = ("agent_say", "agent_intent")  # what an NPC said or proposed: kept with its tick until acknowledged
_json = msgspec.json.Encoder()


class BusConfig(msgspec.Struct, frozen=True, kw_only=True):
    broker: BrokerAddress
    run: str
    shard: str = "0"
    protocol: Literal[5, 311] = 5
    outbox_size: int = 10_000
    mailbox_size: int = 1_000
    seen_ids: int = 200_000
    publish_window: int = 64  # publishes unacknowledged at most (paho and aiomqtt scan them at each publish)
    publish_timeout: float = 10.0
    reconnect: ReconnectPolicy = msgspec.field(default_factory=lambda: ReconnectPolicy(initial=0.05))
    bounds: InputBounds = msgspec.field(default_factory=InputBounds)
    run_key: RunKey | None = None  # seal and check internal messages (sim.protocol.seal)
    trace_batch: int = 64  # traces per `trace/{shard}` message at most
    trace_batch_bytes: int = 256 * 1024  # and its JSON's bytes at most (one trace over it goes alone)
    trace_linger: float = 0.05  # seconds a trace waits for others before its batch goes anyway


class Connected(msgspec.Struct, frozen=True):
    """The bus is connected: at the start (`again` false) and after each reconnection, when
    the shard re-sends what a broker restart may have lost."""

    again: bool


BusEvent = Received | Connected


class Bus:
    """Use `open_bus`; this holds the outbox, the event queue and the connection state around a Router."""

    def __init__(self, config: BusConfig, transport: Transport) -> None:
        self.config = config
        self._transport = transport
        self._redeliveries = transport.redeliveries if isinstance(transport, MqttTransport) else None
        self._router = Router(
            config.run, config.shard, mailbox_size=config.mailbox_size, seen_events=config.seen_ids,
            bounds=config.bounds, run_key=config.run_key,
        )
        self.stats = self._router.stats
        self.mail = self._router.mail
        """What arrived for this shard's places and NPCs, until the shard takes it (its
        places' events after the barrier, each NPC's inbox mail at its turn)."""
        self._filters: list[str] = []
        self._events: collections.deque[BusEvent] = collections.deque()
        self.arrived = asyncio.Event()
        """Set while events wait for `take_events`."""
        self._sender = Sender(size=config.outbox_size, window=config.publish_window, reconnect=config.reconnect,
                              broker=config.broker.url, stats=self.stats)
        self._closing_flush = config.publish_timeout
        self._connections = 0
        self._keep_outside: Callable[[OutsideReceived], None] | None = None
        self._errors = ErrorReplies()
        self._traces = TraceBatches(
            topics.trace(config.run, config.shard), self._sender, max_items=config.trace_batch,
            max_bytes=config.trace_batch_bytes, linger=config.trace_linger,
        )

    # --- routes and what arrived -------------------------------------------

    @property
    def connected(self) -> bool:
        return self._sender.connected.is_set()

    def is_routed(self, topic: str) -> bool:
        """Whether batches on `topic` are taken by this shard (its places, its NPCs' inboxes)."""
        return self._router.is_routed(topic)

    def deliver(self, topic: str, events: Iterable[AnyEvent]) -> None:
        """Deliver events for a topic this shard routes, from the objects, without the broker."""
        self._router.deliver(topic, events)

    def drop_batches_before(self, tick: int) -> None:
        """Batches of earlier ticks are re-sends of what was perceived: their events are dropped."""
        self._router.drop_batches_before(tick)

    async def listen_places(self, listeners: Mapping[str, int]) -> None:
        """Take the events at every place of `listeners` into its intake (heard there by that
        many of this shard's NPCs, for the counts: `Deliveries.listen` as they walk), through
        one wildcard subscription: NPCs walk, so which places a shard hears changes tick by
        tick, and a subscription made when one walks in would race the batches already on
        their way (the shard keeps the places it hears in each tick: sim.shard._whereabouts)."""
        run = self.config.run
        for place, heard_by in listeners.items():
            self._router.route_location(topics.location_events(run, place), place, heard_by)
        wildcard = topics.location_events_all(run)
        if wildcard not in self._filters:
            await self._subscribe([wildcard])

    async def listen_inboxes(self, agents: Iterable[str]) -> None:
        """Deliver each agent's directed events to its mailbox.

        One wildcard subscription (`agent/+/inbox`) for all of them, not one per agent (the
        start-up of a large world). Inbox messages to other shards' agents (directed events,
        few) arrive too; the router drops them without a count.
        """
        self._router.route_inboxes(agents)
        wildcard = topics.agent_inbox_all(self._router.run)
        if wildcard not in self._filters:
            await self._subscribe([wildcard])

    async def listen(self, channel: ChannelName) -> None:
        """Queue an OutsideReceived for each message within bounds on the public channel called
        `channel` (sim.wire.contract.CHANNELS: player input, world state, the game system's
        events and facts, players' presence); an InputRefused for each refused one."""
        await self._subscribe([self._router.route(channel)])

    async def listen_barrier(self) -> None:
        """Queue every shard's barrier messages (sim.protocol.barrier); every batch is reported anyway."""
        await self._subscribe([self._router.route_barrier()])

    def take_events(self) -> list[BusEvent]:
        """Everything queued for the shard since the last call, in arrival order."""
        if self._redeliveries is not None:
            self.stats.redelivered = self._redeliveries.count
        events = list(self._events)
        self._events.clear()
        self.arrived.clear()
        return events

    def _queue(self, event: BusEvent) -> None:
        self._events.append(event)
        self.arrived.set()

    def keep_outside(self, keep: Callable[[OutsideReceived], None]) -> None:
        """Call `keep` with each outside input (player input, world state, ...) as it arrives, before
        it is queued for the shard: the shard journals it then (sim.store._arrivals), not at
        its next phase boundary, which may be a whole tick of turns later."""
        self._keep_outside = keep

    def _deliver(self, topic: str, payload: bytes, retained: bool) -> None:
        event = self._router.receive(topic, payload, retained=retained)
        if event is not None:
            if self._keep_outside is not None and isinstance(event, OutsideReceived):
                self._keep_outside(event)
            self._queue(event)

    async def _subscribe(self, filters: list[str]) -> None:
        self._filters.extend(filters)
        link = self._sender.link
        if link is not None:
            await link.subscribe(filters)

    # --- publishing ------------------------------------------------------------------

    async def publish_barrier(self, message: BarrierMessage) -> tuple[str, bytes]:
        """Send this shard's barrier message, sealed; returns (topic, payload) for re-sending."""
        topic = topics.barrier(self.config.run, self.config.shard)
        payload = seal(self.config.run_key, topic, encode_barrier(message))
        await self.publish(topic, payload)
        return topic, payload

    async def send(self, channel: ChannelName, message: msgspec.Struct) -> None:
        """Publish `message` on the public channel called `channel` (sim.wire.contract.CHANNELS)
        as JSON: on the topic its route builds from this run and the message's fields (`agent`,
        `shard`), retained when the channel is."""
        route = channel_named(channel)
        names = (self.config.run if name == "run" else getattr(message, name) for name in route.parameters)
        await self.publish(route.topic(*names), _json.encode(message), retain=route.retained)

    async def publish_error(self, player: str | None, error: ErrorMessage, now: float) -> None:
        """Tell a client why its message was refused: player `player` on its `error` topic, the
        game system (None) on `game/error`; at most a bounded number per client and window
        (sim.protocol.bounds.ErrorReplies), the rest counted."""
        reply = self._errors.admit(player, error, now)
        self.stats.errors_held = self._errors.held
        if reply is None:
            return
        run = self.config.run
        topic = topics.game_error(run) if player is None else topics.player_error(run, player)
        self.stats.error_replies += 1
        await self.publish(topic, encode_json(reply))

    async def publish_trace(self, message: TraceMessage) -> None:
        """Add the trace to the shard's next `trace/{shard}` batch (a JSON array, in the order
        they were added, sim.protocol.batcher): it goes when `trace_batch` traces or
        `trace_batch_bytes` are waiting, `trace_linger` seconds after the first of them, or
        when the bus closes. A viewer sees a trace at most the linger later."""
        await self._traces.add(encode_trace(message))

    async def flush_traces(self) -> None:
        """Queue the traces waiting for their batch (nothing when none wait)."""
        await self._traces.flush()

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Queue a message for the sender; raise OutboxFullError when it cannot wait.

        While connected a full outbox is backpressure (the caller waits); during an outage
        it is an error, so that nothing is dropped without the caller knowing.
        """
        await self._sender.publish(Outgoing(topic, payload, qos, retain))

    def hurry(self, seconds: float) -> None:
        """Bound the flush on closing to `seconds` (a stopping run does not wait the whole
        `publish_timeout` for a broker that is away)."""
        self._closing_flush = min(self._closing_flush, seconds)

    def unsent_says(self) -> list[tuple[str, bytes]]:
        """The `say` and `intent` messages the broker has not acknowledged yet (in flight, to be
        retried, or queued), as (topic, payload): what a shard keeps with its tick, to send
        again after a kill -9 (a subscriber de-duplicates by inference id)."""
        waiting = self._sender.waiting()
        run = self._router.run
        return [(topic, payload) for topic, payload, _, _ in waiting
                if (parsed := topics.parse(topic)) is not None and parsed.kind in _SPOKEN and parsed.run == run]

    async def wait_sent(self) -> None:
        """Send the traces waiting for their batch, then wait until the outbox is empty
        (callers bound it with a timeout)."""
        await self.flush_traces()
        await self._sender.wait_sent()

    # --- counting --------------------------------------------------------------------

    def count_malformed(self, kind: str, topic: str, exc: Exception) -> None:
        """Count a malformed payload by kind and log the first of each kind; the caller drops it."""
        self._router.count_malformed(kind, topic, exc)

    def refuse(self, kind: str, where: str, why: str) -> None:
        """Count outside input refused over a bound (logged once per kind)."""
        self.stats.refusals.refuse(kind, where, why)

    def report_overflow(self, tick: int) -> None:
        """Log one line for the tick's mailbox overflow, naming each mailbox and its flooder."""
        report = self.stats.overflow.take()
        if report:
            detail = ", ".join(f"{box} dropped {n} (mostly from {source})" for box, (n, source) in report.items())
            log.warning("tick %d: full mailboxes: %s", tick, detail)

    # --- the connection --------------------------------------------------------------

    async def _session(self, link: Link) -> None:
        await link.subscribe(self._filters)
        self._connections += 1
        self.stats.reconnects = self._connections - 1
        self._sender.connect(link)
        self._queue(Connected(again=self._connections > 1))
        async for topic, payload, retained in link.messages():
            self._deliver(topic, payload, retained)

    async def _connection_loop(self) -> None:
        await self._transport.run(self._session, on_lost=self._sender.lost)


def _mqtt_transport(config: BusConfig) -> MqttTransport:
    """The bus's MQTT connection: the shard's "offline" status is its last will."""
    offline = encode_json(StatusMessage(run=config.run, shard=config.shard, state="offline"))
    return MqttTransport(
        config.broker,
        name=f"bus of shard {config.shard}",
        policy=config.reconnect,
        client=ClientOptions(
            protocol=config.protocol,
            will=LastWill(topics.status(config.run, config.shard), offline, retain=True),
            timeout=config.publish_timeout,
            max_inflight=config.publish_window,
            keep_session=True,
        ),
        publish_timeout=math.inf,  # no timer per message: the sender cancels what a lost connection holds
    )


@asynccontextmanager
async def open_bus(config: BusConfig, *, transport: Transport | None = None) -> AsyncIterator[Bus]:
    """Connect (or raise BrokerError after the reconnect patience), run the loops, close cleanly.

    `transport` defaults to MQTT to `config.broker`. On a normal exit the outbox is sent
    first (bounded by `publish_timeout`, or less after `hurry`).
    """
    bus = Bus(config, transport or _mqtt_transport(config))
    try:
        async with asyncio.TaskGroup() as group:
            connection = group.create_task(bus._connection_loop(), name="bus-connection")
            sender = group.create_task(bus._sender.run(), name="bus-sender")
            flusher = group.create_task(bus._traces.run(), name="bus-traces")
            await bus._sender.connected.wait()
            try:
                yield bus
                try:
                    async with asyncio.timeout(bus._closing_flush):
                        await bus.wait_sent()
                except TimeoutError:
                    unsent = bus._sender.unsent()
                    why = "broker unreachable" if not bus.connected else f"not sent within {bus._closing_flush:g} s"
                    log.warning("closing the bus with %d unsent messages (%s)", unsent, why)
            finally:
                flusher.cancel()
                sender.cancel()
                connection.cancel()
    except BaseExceptionGroup as group_error:
        raise single_error(group_error) from None
