"""The shard's MQTT bus: one connection, the outbox, and the routing it feeds.

    async with open_bus(BusConfig(broker=BrokerAddress.parse(url), run="r1", shard="0")) as bus:
        box = bus.mailbox("blacksmith")
        await bus.listen_location("forge", ["blacksmith"])
        bus.emit(topics.location_events(run, "forge"), event)   # batched per tick
        sent = await bus.flush(tick)                             # one msgpack message per topic
        await bus.wait_for(lambda: barrier.passed(tick))         # sim.protocol.barrier says when

Every event, local or not, travels through the broker, and a tick's events are perceived
at the next tick once the tick barrier (sim.protocol.barrier) says that every batch of the tick
has arrived. The agents then drain their mailboxes sorted by (tick, id), so asyncio's
scheduling order and the broker's interleaving of topics never reach the results.

What arrives is decided by `sim.protocol.router.Router` (sans-I/O: routes, mailboxes,
de-duplication, bounds); the connection and its reconnect policy are `sim.mqtt`'s.
After every (re)connection the bus calls `on_connected`, so that the shard re-sends
what a broker restart may have lost. Delivery is QoS 1 (at least once); publishes wait in a bounded outbox while
the broker is away and, when it is full, the caller gets OutboxFullError: a QoS 1 event is
never dropped silently.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Literal

import aiomqtt
import msgspec

from sim.errors import BusError, OutboxFullError, single_error
from sim.mqtt import Backoff, BrokerAddress, ReconnectPolicy, mqtt_error, open_client, stay_connected
from sim.protocol.bounds import InputBounds
from sim.protocol.mailbox import Mailbox
from sim.protocol.router import BarrierHandler, BatchHandler, BusStats, PlayerInputHandler, Router, WorldStateHandler
from sim.protocol.seal import RunKey
from sim.wire import topics
from sim.wire.barrier import BarrierMessage, encode_barrier
from sim.wire.events import (
    AnyEvent,
    EventBatch,
    SayMessage,
    StatusMessage,
    WorldStateMessage,
    encode_batch,
    encode_json,
)

__all__ = ["Bus", "BusConfig", "BusStats", "Mailbox", "PlayerInputHandler", "open_bus", "single_error"]

log = logging.getLogger(__name__)


class BusConfig(msgspec.Struct, frozen=True, kw_only=True):
    broker: BrokerAddress
    run: str
    shard: str = "0"
    protocol: Literal[5, 311] = 5
    outbox_size: int = 10_000
    mailbox_size: int = 1_000
    seen_ids: int = 200_000
    publish_concurrency: int = 64
    publish_timeout: float = 10.0
    reconnect: ReconnectPolicy = msgspec.field(default_factory=lambda: ReconnectPolicy(initial=0.05))
    bounds: InputBounds = msgspec.field(default_factory=InputBounds)
    run_key: RunKey | None = None  # sign and check internal batches (sim.protocol.seal)


_Outgoing = tuple[str, bytes, int, bool]


class Bus:
    """Use `open_bus`; this holds the outbox and the connection state around a Router."""

    def __init__(self, config: BusConfig) -> None:
        self.config = config
        self.router = Router(
            config.run, config.shard, mailbox_size=config.mailbox_size, seen_events=config.seen_ids,
            bounds=config.bounds, run_key=config.run_key,
        )
        self.stats = self.router.stats
        self._filters: list[str] = []
        self._pending: dict[str, list[AnyEvent]] = {}
        self._received = asyncio.Event()
        self.on_connected: Callable[[], Awaitable[None]] | None = None
        self._outbox: collections.deque[_Outgoing] = collections.deque()
        self._outbox_ready = asyncio.Event()
        self._outbox_space = asyncio.Event()
        self._outbox_space.set()
        self._inflight = 0
        self._connected = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._connections = 0

    # --- mailboxes and routes --------------------------------------------------------

    def mailbox(self, agent: str) -> Mailbox:
        return self.router.mailbox(agent)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def listen_location(self, location: str, agents: Iterable[str]) -> None:
        """Deliver the events at `location` to these agents' mailboxes."""
        topic = topics.location_events(self.config.run, location)
        if self.router.route_location(topic, list(agents)):
            await self._subscribe([topic])

    async def listen_inboxes(self, agents: Iterable[str]) -> None:
        """Deliver each agent's directed events to its mailbox.

        One wildcard subscription (`agent/+/inbox`) for all of them: one subscription per
        agent took 12 s of start-up at 100,000 NPCs. Inbox messages to other shards' agents
        (directed events, few) arrive too; the router drops them without a count.
        """
        for agent in agents:
            self.router.route_inbox(topics.agent_inbox(self.config.run, agent), agent)
        wildcard = self.router.agent_prefix + "+/inbox"
        if wildcard not in self._filters:
            await self._subscribe([wildcard])

    async def listen_player_input(self, handler: PlayerInputHandler) -> None:
        """Call `handler(player, message)` for each JSON input on `player/+/input` within bounds."""
        self.router.player_handler = handler
        await self._subscribe([self.router.player_prefix + "+/input"])

    async def listen_world_state(self, handler: WorldStateHandler) -> None:
        """Call `handler(message)` for the retained world state and every change within bounds."""
        self.router.world_handler = handler
        await self._subscribe([self.router.world_topic])

    async def listen_barrier(self, on_batch: BatchHandler, on_message: BarrierHandler) -> None:
        """Report every batch received, and every shard's barrier messages (sim.protocol.barrier)."""
        self.router.batch_handler = on_batch
        self.router.barrier_handler = on_message
        await self._subscribe([topics.barrier_all(self.config.run)])

    async def publish_barrier(self, message: BarrierMessage) -> tuple[str, bytes]:
        """Send this shard's barrier message; returns (topic, payload) for re-sending."""
        topic = topics.barrier(self.config.run, self.config.shard)
        body = encode_barrier(message)
        payload = body if self.config.run_key is None else self.config.run_key.sign(topic, body)
        await self.publish(topic, payload)
        return topic, payload

    @property
    def filters(self) -> tuple[str, ...]:
        """The topic filters this bus subscribes to (again after each reconnect)."""
        return tuple(self._filters)

    def deliver(self, topic: str, payload: bytes) -> None:
        """Route one received message and wake `wait_for` (the connection loop calls it)."""
        self.router.receive(topic, payload)
        self._received.set()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Wait until `condition()` holds, checked after each message received (callers bound it)."""
        while not condition():
            self._received.clear()
            await self._received.wait()

    async def publish_world_state(self, message: WorldStateMessage) -> None:
        await self.publish(self.router.world_topic, encode_json(message), retain=True)

    async def _subscribe(self, filters: list[str]) -> None:
        self._filters.extend(filters)
        client = self._client
        if client is not None and self._connected.is_set():
            await _subscribe_all(client, filters)

    # --- publishing ------------------------------------------------------------------

    def emit(self, topic: str, event: AnyEvent) -> None:
        """Queue an event for this tick's batch on `topic`; `flush` sends it."""
        self._pending.setdefault(topic, []).append(event)

    async def flush(self, tick: int) -> list[tuple[str, bytes, int]]:
        """Publish one msgpack batch per topic with this tick's events.

        Returns (topic, payload, events) per batch, in sending order, for the barrier.
        """
        pending, self._pending = self._pending, {}
        sent = []
        for topic in sorted(pending):
            events = tuple(sorted(pending[topic], key=lambda e: (e.tick, e.id)))
            body = encode_batch(EventBatch(shard=self.config.shard, tick=tick, events=events))
            key = self.config.run_key
            payload = body if key is None else key.sign(topic, body)
            await self.publish(topic, payload)
            sent.append((topic, payload, len(events)))
        return sent

    def report_overflow(self, tick: int) -> None:
        """Log one line for the tick's mailbox overflow, naming each mailbox and its flooder."""
        report = self.stats.overflow.take()
        if report:
            detail = ", ".join(f"{box} dropped {n} (mostly from {source})" for box, (n, source) in report.items())
            log.warning("tick %d: full mailboxes: %s", tick, detail)

    async def publish_say(self, message: SayMessage) -> None:
        await self.publish(topics.agent_say(self.config.run, message.agent), encode_json(message))

    async def publish_status(self, message: StatusMessage) -> None:
        await self.publish(topics.status(self.config.run, self.config.shard), encode_json(message), retain=True)

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Queue a message for the sender; raise OutboxFullError when it cannot wait.

        While connected a full outbox is backpressure (the caller waits); during an outage
        it is an error, so that nothing is dropped without the caller knowing.
        """
        while len(self._outbox) >= self.config.outbox_size:
            if not self._connected.is_set():
                raise OutboxFullError(
                    f"outbox full ({self.config.outbox_size} messages) while the broker "
                    f"{self.config.broker.url} is unreachable; cannot queue a message for {topic}"
                )
            self._outbox_space.clear()
            await self._outbox_space.wait()
        self._outbox.append((topic, payload, qos, retain))
        self._outbox_ready.set()

    async def wait_sent(self) -> None:
        """Wait until the outbox is empty (callers bound it with a timeout)."""
        while self._outbox or self._inflight:
            self._outbox_space.clear()
            await self._outbox_space.wait()

    def count_malformed(self, kind: str, topic: str, exc: Exception) -> None:
        """Count a malformed payload by kind and log the first of each kind; the caller drops it."""
        self.router.count_malformed(kind, topic, exc)

    def refuse(self, kind: str, where: str, why: str) -> None:
        """Count outside input refused over a bound (logged once per kind)."""
        self.stats.refusals.refuse(kind, where, why)

    # --- the connection --------------------------------------------------------------

    def _new_client(self) -> aiomqtt.Client:
        offline = encode_json(StatusMessage(run=self.config.run, shard=self.config.shard, state="offline"))
        return open_client(
            self.config.broker,
            protocol=self.config.protocol,
            will=aiomqtt.Will(topics.status(self.config.run, self.config.shard), offline, qos=1, retain=True),
            timeout=self.config.publish_timeout,
            max_inflight=self.config.publish_concurrency,
        )

    async def _session(self, client: aiomqtt.Client) -> None:
        await _subscribe_all(client, self._filters)
        self._client = client
        self._connections += 1
        self.stats.reconnects = self._connections - 1
        self._connected.set()
        self._outbox_ready.set()
        if self.on_connected is not None and self._connections > 1:
            await self.on_connected()
        async for message in client.messages:
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                self.count_malformed("non-binary", str(message.topic), TypeError(type(payload).__name__))
                continue
            self.deliver(message.topic.value, bytes(payload))

    def _lost(self) -> None:
        self._connected.clear()
        self._client = None
        self._outbox_space.set()

    async def _connection_loop(self) -> None:
        await stay_connected(
            self.config.broker, self._session, name=f"bus of shard {self.config.shard}",
            policy=self.config.reconnect, connect=self._new_client, on_lost=self._lost,
        )

    async def _sender(self) -> None:
        """Publish the outbox in order; a failed publish goes back to the head for retry.

        Up to `publish_concurrency` publishes are in flight; paho hands them to the socket
        in the order they were started, so the broker sees the outbox order.
        """
        backoff = Backoff(self.config.reconnect)
        while True:
            await self._outbox_ready.wait()
            await self._connected.wait()
            client = self._client
            if not self._outbox or client is None:
                self._outbox_ready.clear()
                continue
            chunk = [self._outbox.popleft() for _ in range(min(len(self._outbox), self.config.publish_concurrency))]
            self._inflight = len(chunk)
            self._outbox_space.set()
            results = await asyncio.gather(
                *(client.publish(t, p, qos=q, retain=r) for t, p, q, r in chunk), return_exceptions=True
            )
            failed = []
            for item, result in zip(chunk, results, strict=True):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                if isinstance(result, BaseException):
                    if mqtt_error(result) is None:
                        raise BusError(f"publishing to {item[0]} failed: {result!r}") from result
                    failed.append(item)
                else:
                    self.stats.messages_out += 1
            self._inflight = 0
            self._outbox_space.set()
            if failed:
                log.warning("%d publishes failed; they are retried after a backoff", len(failed))
                self._outbox.extendleft(reversed(failed))
                await asyncio.sleep(backoff.next())
            else:
                backoff.reset()
            if not self._outbox:
                self._outbox_ready.clear()


async def _subscribe_all(client: aiomqtt.Client, filters: list[str], chunk: int = 500) -> None:
    for i in range(0, len(filters), chunk):
        await client.subscribe([(f, 1) for f in filters[i : i + chunk]])


@asynccontextmanager
async def open_bus(config: BusConfig) -> AsyncIterator[Bus]:
    """Connect (or raise BrokerError after the reconnect patience), run the loops, close cleanly.

    On a normal exit the outbox is sent first (bounded by `publish_timeout`).
    """
    bus = Bus(config)
    try:
        async with asyncio.TaskGroup() as group:
            connection = group.create_task(bus._connection_loop(), name="bus-connection")
            sender = group.create_task(bus._sender(), name="bus-sender")
            await bus._connected.wait()
            try:
                yield bus
                try:
                    async with asyncio.timeout(config.publish_timeout):
                        await bus.wait_sent()
                except TimeoutError:
                    log.warning("closing the bus with %d unsent messages (broker unreachable)", len(bus._outbox))
            finally:
                sender.cancel()
                connection.cancel()
    except BaseExceptionGroup as group_error:
        raise single_error(group_error) from None
