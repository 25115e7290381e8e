"""The shard's MQTT bus: one aiomqtt client, routing to agents' mailboxes.

    async with open_bus(BusConfig(url=..., run="r1", shard="0")) as bus:
        box = bus.mailbox("blacksmith")
        await bus.listen_location("forge", ["blacksmith"])
        bus.emit(topics.location_events(run, "forge"), event)   # batched per tick
        await bus.flush(tick)                                    # one msgpack message per topic
        await bus.wait_echoes()                                  # own batches came back

Why the echo wait: every event, local or not, travels through the broker, and a tick's
events are perceived at the next tick once the shard's own batches have come back. The
agents then drain their mailboxes sorted by (tick, id), so asyncio's scheduling order and
the broker's interleaving of topics never reach the results.

Delivery is QoS 1 (at least once); the bus drops redeliveries by event id with a bounded
LRU of seen ids. A lost connection is retried with jittered exponential backoff; publishes
wait in a bounded outbox meanwhile and, when it is full, the caller gets OutboxFullError:
a QoS 1 event is never dropped silently. A malformed payload is counted per kind, logged
once per kind and dropped; it never ends a task.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import aiomqtt
import msgspec

from sim import topics
from sim.errors import BrokerError, BusError, ConfigError, OutboxFullError
from sim.events import (
    AnyEvent,
    EventBatch,
    PlayerInputMessage,
    SayMessage,
    StatusMessage,
    WorldStateMessage,
    decode_batch,
    decode_player_input,
    decode_world_state,
    encode_batch,
    encode_json,
)

__all__ = ["BusConfig", "BusStats", "Bus", "Mailbox", "PlayerInputHandler", "open_bus", "parse_url", "single_error"]

log = logging.getLogger(__name__)
# aiomqtt warns for every publish beyond ten in flight; the bus keeps up to
# `publish_concurrency` in flight on purpose, so only its errors are shown.
_mqtt_log = logging.getLogger(__name__ + ".aiomqtt")
_mqtt_log.setLevel(logging.ERROR)

PlayerInputHandler = Callable[[str, PlayerInputMessage], None]
WorldStateHandler = Callable[[WorldStateMessage], None]


def parse_url(url: str) -> tuple[str, int]:
    """`mqtt://host:port` -> (host, port); refuses anything else, naming the URL."""
    parts = urlsplit(url)
    if parts.scheme != "mqtt" or not parts.hostname:
        raise ConfigError(f"broker URL {url!r}: expected mqtt://host:port")
    try:
        port = parts.port or 1883
    except ValueError as exc:
        raise ConfigError(f"broker URL {url!r}: bad port") from exc
    return parts.hostname, port


class BusConfig(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    run: str
    shard: str = "0"
    protocol: Literal[5, 311] = 5
    username: str | None = None
    password: str | None = None
    outbox_size: int = 10_000
    mailbox_size: int = 1_000
    seen_ids: int = 200_000
    publish_concurrency: int = 64
    publish_timeout: float = 10.0
    backoff_initial: float = 0.05
    backoff_max: float = 5.0
    connect_attempts: int = 5


@dataclass
class BusStats:
    """Counters for the progress display, the benchmark and the tests."""

    messages_in: int = 0
    messages_out: int = 0
    events_in: int = 0
    events_delivered: int = 0
    duplicates: int = 0
    reconnects: int = 0
    mailbox_overflow: int = 0
    malformed: dict[str, int] = field(default_factory=dict)


class Mailbox:
    """An agent's bounded mailbox; drained once per tick in a stable order.

    When full, the oldest event is dropped, counted and logged once: an agent that falls
    that far behind must not make the shard's memory grow without bound.
    """

    __slots__ = ("_items", "_stats", "maxsize")

    def __init__(self, maxsize: int, stats: BusStats) -> None:
        self._items: collections.deque[AnyEvent] = collections.deque()
        self._stats = stats
        self.maxsize = maxsize

    def put(self, event: AnyEvent) -> None:
        if len(self._items) >= self.maxsize:
            self._items.popleft()
            self._stats.mailbox_overflow += 1
            if self._stats.mailbox_overflow == 1:
                log.warning("a mailbox is full (%d events): dropping its oldest events", self.maxsize)
        self._items.append(event)

    def __len__(self) -> int:
        return len(self._items)

    def drain(self) -> list[AnyEvent]:
        """Every waiting event, sorted by (tick, id): the order never depends on arrival."""
        items = sorted(self._items, key=lambda e: (e.tick, e.id))
        self._items.clear()
        return items


class _SeenIds:
    """A bounded LRU set of event ids."""

    def __init__(self, size: int) -> None:
        self._ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._size = size

    def first_time(self, event_id: str) -> bool:
        if event_id in self._ids:
            self._ids.move_to_end(event_id)
            return False
        self._ids[event_id] = None
        if len(self._ids) > self._size:
            self._ids.popitem(last=False)
        return True


_Outgoing = tuple[str, bytes, int, bool]


class Bus:
    """Use `open_bus`; this holds the routing tables, the outbox and the counters."""

    def __init__(self, config: BusConfig) -> None:
        self.config = config
        self.stats = BusStats()
        self._host, self._port = parse_url(config.url)
        self._mailboxes: dict[str, Mailbox] = {}
        self._location_routes: dict[str, tuple[str, ...]] = {}
        self._inbox_routes: dict[str, str] = {}
        self._player_handler: PlayerInputHandler | None = None
        self._world_handler: WorldStateHandler | None = None
        self._world_topic = topics.world_state(config.run)
        self._player_prefix = topics.run_root(config.run) + "/player/"
        self._agent_prefix = topics.run_root(config.run) + "/agent/"
        self._filters: list[str] = []
        self._seen = _SeenIds(config.seen_ids)
        self._pending: dict[str, list[AnyEvent]] = {}
        self._awaiting: set[tuple[str, int]] = set()
        self._echoed = asyncio.Event()
        self._echoed.set()
        self._outbox: collections.deque[_Outgoing] = collections.deque()
        self._outbox_ready = asyncio.Event()
        self._outbox_space = asyncio.Event()
        self._outbox_space.set()
        self._inflight = 0
        self._connected = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._logged: set[str] = set()

    # --- mailboxes and routes --------------------------------------------------------

    def mailbox(self, agent: str) -> Mailbox:
        box = self._mailboxes.get(agent)
        if box is None:
            box = self._mailboxes[agent] = Mailbox(self.config.mailbox_size, self.stats)
        return box

    async def listen_location(self, location: str, agents: Iterable[str]) -> None:
        """Deliver the events at `location` to these agents' mailboxes."""
        topic = topics.location_events(self.config.run, location)
        known = self._location_routes.get(topic, ())
        self._location_routes[topic] = tuple(sorted({*known, *agents}))
        if not known:
            await self._subscribe([topic])

    async def listen_inboxes(self, agents: Iterable[str]) -> None:
        """Deliver each agent's directed events to its mailbox.

        One wildcard subscription (`agent/+/inbox`) for all of them: one subscription per
        agent took 12 s of start-up at 100,000 NPCs. Inbox messages to other shards' agents
        (directed events, few) arrive too and are dropped without a count.
        """
        for agent in agents:
            self._inbox_routes[topics.agent_inbox(self.config.run, agent)] = agent
        wildcard = self._agent_prefix + "+/inbox"
        if wildcard not in self._filters:
            await self._subscribe([wildcard])

    async def listen_player_input(self, handler: PlayerInputHandler) -> None:
        """Call `handler(player, message)` for each JSON input on `player/+/input`."""
        self._player_handler = handler
        await self._subscribe([self._player_prefix + "+/input"])

    async def listen_world_state(self, handler: WorldStateHandler) -> None:
        """Call `handler(message)` for the retained world state and every change to it."""
        self._world_handler = handler
        await self._subscribe([self._world_topic])

    async def publish_world_state(self, message: WorldStateMessage) -> None:
        await self.publish(self._world_topic, encode_json(message), retain=True)

    async def _subscribe(self, filters: list[str]) -> None:
        self._filters.extend(filters)
        client = self._client
        if client is not None and self._connected.is_set():
            await _subscribe_all(client, filters)

    # --- publishing ------------------------------------------------------------------

    def emit(self, topic: str, event: AnyEvent) -> None:
        """Queue an event for this tick's batch on `topic`; `flush` sends it."""
        self._pending.setdefault(topic, []).append(event)

    async def flush(self, tick: int) -> int:
        """Publish one msgpack batch per topic with this tick's events; returns how many."""
        pending, self._pending = self._pending, {}
        for topic in sorted(pending):
            events = tuple(sorted(pending[topic], key=lambda e: (e.tick, e.id)))
            if topic in self._location_routes or topic in self._inbox_routes:
                self._awaiting.add((topic, tick))
                self._echoed.clear()
            await self.publish(topic, encode_batch(EventBatch(shard=self.config.shard, tick=tick, events=events)))
        return len(pending)

    async def wait_echoes(self) -> None:
        """Wait until every batch this shard published to its own topics came back.

        Callers bound the wait (`asyncio.timeout`): during an outage it can last long.
        """
        await self._echoed.wait()

    def forget_echoes(self) -> int:
        """Stop waiting for batches that did not come back in time; returns how many."""
        missing = len(self._awaiting)
        self._awaiting.clear()
        self._echoed.set()
        return missing

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
                    f"{self.config.url} is unreachable; cannot queue a message for {topic}"
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

    # --- receiving -------------------------------------------------------------------

    def count_malformed(self, kind: str, topic: str, exc: Exception) -> None:
        """Count a malformed payload by kind and log the first of each kind; the caller drops it."""
        self.stats.malformed[kind] = self.stats.malformed.get(kind, 0) + 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("dropping a malformed %s payload on %s: %s (logged once per kind)", kind, topic, exc)

    def _dispatch(self, topic: str, payload: bytes) -> None:
        self.stats.messages_in += 1
        agent = self._inbox_routes.get(topic)
        recipients = self._location_routes.get(topic)
        if recipients is not None or agent is not None:
            try:
                batch = decode_batch(payload)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.count_malformed("location events" if agent is None else "inbox", topic, exc)
                return
            if batch.shard == self.config.shard:
                self._awaiting.discard((topic, batch.tick))
                if not self._awaiting:
                    self._echoed.set()
            for event in batch.events:
                self.stats.events_in += 1
                if not self._seen.first_time(event.id):
                    self.stats.duplicates += 1
                    continue
                for name in recipients if recipients is not None else (agent,):
                    self.mailbox(name).put(event)  # type: ignore[arg-type]
                    self.stats.events_delivered += 1
            return
        if topic.startswith(self._player_prefix) and topic.endswith("/input") and self._player_handler:
            player = topic[len(self._player_prefix) : -len("/input")]
            try:
                message = decode_player_input(payload)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.count_malformed("player input", topic, exc)
                return
            self._player_handler(player, message)
            return
        if topic.startswith(self._agent_prefix) and topic.endswith("/inbox"):
            return  # another shard's agent (see `listen_inboxes`)
        if topic == self._world_topic and self._world_handler:
            try:
                world = decode_world_state(payload)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.count_malformed("world state", topic, exc)
                return
            self._world_handler(world)
            return
        self.count_malformed("unrouted", topic, ValueError("no route for this topic"))

    # --- the connection --------------------------------------------------------------

    def _new_client(self) -> aiomqtt.Client:
        protocol = aiomqtt.ProtocolVersion.V5 if self.config.protocol == 5 else aiomqtt.ProtocolVersion.V311
        offline = encode_json(StatusMessage(run=self.config.run, shard=self.config.shard, state="offline"))
        return aiomqtt.Client(
            self._host,
            self._port,
            username=self.config.username,
            password=self.config.password,
            protocol=protocol,
            logger=_mqtt_log,
            will=aiomqtt.Will(topics.status(self.config.run, self.config.shard), offline, qos=1, retain=True),
            keepalive=30,
            timeout=self.config.publish_timeout,
            max_queued_incoming_messages=0,
        )

    def _backoff(self, attempt: int) -> float:
        """Full-jitter exponential backoff."""
        cap = min(self.config.backoff_max, self.config.backoff_initial * 2**attempt)
        return random.uniform(cap / 2, cap)

    async def _connection_loop(self, first: asyncio.Future[None]) -> None:
        attempt = 0
        while True:
            try:
                async with self._new_client() as client:
                    await _subscribe_all(client, self._filters)
                    self._client = client
                    self._connected.set()
                    self._outbox_ready.set()
                    if not first.done():
                        first.set_result(None)
                    elif attempt:
                        log.warning("reconnected to %s", self.config.url)
                    attempt = 0
                    async for message in client.messages:
                        payload = message.payload
                        if not isinstance(payload, bytes | bytearray):
                            self.count_malformed("non-binary", str(message.topic), TypeError(type(payload).__name__))
                            continue
                        self._dispatch(message.topic.value, bytes(payload))
            except aiomqtt.MqttError as exc:
                self._connected.clear()
                self._client = None
                self._outbox_space.set()
                attempt += 1
                if not first.done() and attempt >= self.config.connect_attempts:
                    first.set_exception(BrokerError(f"cannot connect to the broker at {self.config.url}: {exc}"))
                    return
                self.stats.reconnects += first.done()
                delay = self._backoff(attempt)
                log.warning(
                    "MQTT connection to %s lost or refused (%s); retrying in %.2f s", self.config.url, exc, delay
                )
                await asyncio.sleep(delay)

    async def _sender(self) -> None:
        """Publish the outbox in order; a failed publish goes back to the head for retry.

        Up to `publish_concurrency` publishes are in flight; paho hands them to the socket
        in the order they were started, so the broker sees the outbox order.
        """
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
                    if not isinstance(result, aiomqtt.MqttError):
                        raise BusError(f"publishing to {item[0]} failed: {result!r}") from result
                    failed.append(item)
                else:
                    self.stats.messages_out += 1
            self._inflight = 0
            self._outbox_space.set()
            if failed:
                log.warning("%d publishes failed; they are retried after a backoff", len(failed))
                self._outbox.extendleft(reversed(failed))
                await asyncio.sleep(self._backoff(1))
            if not self._outbox:
                self._outbox_ready.clear()


async def _subscribe_all(client: aiomqtt.Client, filters: list[str], chunk: int = 500) -> None:
    for i in range(0, len(filters), chunk):
        await client.subscribe([(f, 1) for f in filters[i : i + chunk]])


@asynccontextmanager
async def open_bus(config: BusConfig) -> AsyncIterator[Bus]:
    """Connect (or raise BrokerError), run the connection and sender loops, and close cleanly.

    On a normal exit the outbox is sent first (bounded by `publish_timeout`).
    """
    bus = Bus(config)
    first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    try:
        async with asyncio.TaskGroup() as group:
            connection = group.create_task(bus._connection_loop(first), name="bus-connection")
            sender = group.create_task(bus._sender(), name="bus-sender")
            try:
                await first
            except BrokerError:
                sender.cancel()
                raise
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


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error a TaskGroup wrapped (Python 3.11 wraps the body's too); else the group."""
    return group.exceptions[0] if len(group.exceptions) == 1 else group
