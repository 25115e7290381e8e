"""The shard's routing: which message goes where, sans-I/O (bytes in, events out; no client, no awaits).

`Router.receive(topic, payload)` decodes one MQTT message, and `Router.deliver(topic,
events)` takes the events a shard emitted for its own places and NPCs, from the objects.
A place's events wait in its intake (bounded like a mailbox, the flooder losing its own
excess) until the shard appends them to the place's log after the tick's barrier
(`take_place_events`): one copy per place, whoever listens there. Inbox events go to the
addressee's mailbox, made when its first mail arrives. What the shard must act on comes
back as one typed event (sim.protocol.received): every batch that arrived on a routed
topic, every tick-barrier message, every outside input within bounds (player input, world
state, the game system's events and facts, players' presence: an `OutsideReceived`). Which
of those the router takes at all is configured (`route(channel)` for a public channel,
`route_barrier`); a message on a topic it does not route is counted as unrouted. The bus
feeds it from the connection; tests feed it bytes directly.

Outside input is read as its channel says (sim.wire.contract.CHANNELS): the name in its
topic, its payload type, its bound (sim.protocol.bounds), who gets its errors. Malformed
payloads are counted per kind and logged once per kind; outside input over its bound is
refused and counted by kind. Neither ever raises. So is a retained message on a channel that
is not retained (`player/+/input`, `game/...`; the MQTT retain flag of the delivery,
`retained`): what a broker kept from an earlier run, or from a `mosquitto_pub -r`, is not
taken again at every start. Each refused message on a public topic gives an `InputRefused`,
the error its client is to get (`ErrorMessage`, with a stable code): the shard decides
whether it is the one to answer. A retained `world/state` comes back marked as such: the
shard does not apply it, and says so when it differs from its world.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import msgspec

from sim.protocol.bounds import InputBounds, Refusals, bound_problem
from sim.protocol.mailbox import Deliveries, Overflow
from sim.protocol.received import (
    BarrierReceived,
    BatchArrived,
    InputRefused,
    OutsideReceived,
    Received,
    error_code,
    id_in,
    refused,
)
from sim.protocol.seal import UNSIGNED, RunKey, refusal, unseal
from sim.wire import topics
from sim.wire.barrier import Hello, decode_barrier
from sim.wire.channel import Channel
from sim.wire.contract import ChannelName, channel_named
from sim.wire.events import NAME_RULE, AnyEvent, PlayerInputMessage, decode_batch, is_name

__all__ = ["BusStats", "Router", "retained_why"]

log = logging.getLogger(__name__)


@dataclass
class BusStats:
    """Counters for the progress display, the summary, the benchmark and the tests."""

    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0  # payload bytes of every message received from the broker
    events_in: int = 0  # events in batches received from the broker
    events_local: int = 0  # events this shard delivered to itself, without the broker
    events_delivered: int = 0
    duplicates: int = 0
    redelivered: int = 0  # messages the broker sent again after a lost connection, dropped (sim.mqtt)
    stale_batches: int = 0  # re-sent batches of ticks already perceived, dropped
    reconnects: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    overflow: Overflow = field(default_factory=Overflow)
    refusals: Refusals = field(default_factory=Refusals)

    @property
    def mailbox_overflow(self) -> int:
        """Events dropped from full mailboxes, in total."""
        return self.overflow.total

    error_replies: int = 0  # error replies published to outside clients
    errors_held: int = 0  # error replies held back by the per-client rate

    @property
    def refused(self) -> dict[str, int]:
        """Outside input refused over a bound, by kind."""
        return self.refusals.counts


class Router:
    """Routes, mailboxes and de-duplication for one shard of one run."""

    def __init__(
        self,
        run: str,
        shard: str,
        *,
        mailbox_size: int,
        seen_events: int,
        bounds: InputBounds,
        run_key: RunKey | None = None,
        stats: BusStats | None = None,
    ) -> None:
        self.shard = shard
        self.run_key = run_key
        self.stats = stats or BusStats()
        self.bounds = bounds
        self.mail = Deliveries(mailbox_size, seen_events, self.stats)
        self._places: dict[str, str] = {}  # location topic -> place
        self._inboxes: list[AbstractSet[str]] = []  # the agents whose inbox topics are routed here
        self._logged: set[str] = set()
        self.run = run
        self._outside: dict[topics.TopicKind, Channel] = {}  # the public channels taken here, by topic kind
        self._barrier = False
        # Batches of earlier ticks are re-sends whose events were perceived already (the
        # shard raises this to the tick whose barrier it waits for): they are dropped.
        self._stale_before = 0

    # --- routes ------------------------------------------------------------------------

    def route_location(self, topic: str, place: str, listeners: int) -> bool:
        """Take `topic`'s events into `place`'s intake (`listeners` NPCs hear them there);
        True when the topic is new (subscribe it)."""
        new = topic not in self._places
        self._places[topic] = place
        self.mail.listen(place, listeners)
        return new

    def route_inboxes(self, agents: Iterable[str]) -> None:
        """Deliver each of these agents' directed events (`agent/{id}/inbox`) to its mailbox.

        A set (such as a shard's layout's) is kept as it is, not copied: a shard's million
        NPCs are held once."""
        self._inboxes.append(agents if isinstance(agents, AbstractSet) else frozenset(agents))

    def _parse(self, topic: str) -> tuple[topics.TopicKind | None, str]:
        """The kind of `topic` and the name in it (`topics.parse`); (None, "") when it is not
        a topic of this run."""
        parsed = topics.parse(topic)
        return (None, "") if parsed is None or parsed.run != self.run else (parsed.kind, parsed.name)

    def _is_local(self, agent: str) -> bool:
        """Whether `agent`'s inbox is routed here."""
        return any(agent in agents for agents in self._inboxes)

    def _inbox_agent(self, topic: str) -> str | None:
        """The local agent whose inbox `topic` is, or None."""
        kind, agent = self._parse(topic)
        return agent if kind == "agent_inbox" and self._is_local(agent) else None

    def route(self, name: ChannelName) -> str:
        """Take outside input on the public channel called `name` (sim.wire.contract.CHANNELS),
        within its bound; returns the topic filter to subscribe."""
        channel = channel_named(name)
        self._outside[channel.kind] = channel
        return channel.filter(self.run)

    def route_barrier(self) -> str:
        """Take every shard's barrier messages; returns the topic filter to subscribe."""
        self._barrier = True
        return topics.barrier_all(self.run)

    def is_routed(self, topic: str) -> bool:
        """Whether batches on `topic` are taken here (the barrier waits only for those)."""
        return topic in self._places or self._inbox_agent(topic) is not None

    # --- what waits ---------------------------------------------------------------------

    def drop_batches_before(self, tick: int) -> None:
        """Batches of ticks before `tick` were perceived already: drop their events (still reported)."""
        self._stale_before = tick

    # --- receiving ---------------------------------------------------------------------

    def count_malformed(self, kind: str, topic: str, exc: Exception) -> None:
        """Count a malformed payload by kind and log the first of each kind; the caller drops it."""
        self.stats.malformed[kind] = self.stats.malformed.get(kind, 0) + 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("dropping a malformed %s payload on %s: %s (logged once per kind)", kind, topic, exc)

    def receive(self, topic: str, payload: bytes, *, retained: bool = False) -> Received | None:
        """Route one message: its events to the places' intakes and the mailboxes, and what the
        shard must know of it as an event. Never raises for what the payload holds.
        `retained`: the broker kept it from before this subscription (the MQTT retain flag)."""
        self.stats.messages_in += 1
        self.stats.bytes_in += len(payload)
        if topic in self._places:
            return self._receive_batch(topic, payload)
        kind, name = self._parse(topic)
        if kind == "agent_inbox":
            if self._is_local(name):
                return self._receive_batch(topic, payload)
            return None  # another shard's agent: shards share one `agent/+/inbox` subscription
        channel = self._outside.get(kind) if kind is not None else None
        if channel is not None:
            return self._receive_outside(channel, topic, name, payload, retained)
        if self._barrier and kind == "barrier":
            return self._receive_barrier(topic, name, payload)
        self.count_malformed("unrouted", topic, ValueError("no route for this topic"))
        return None

    def _open(self, topic: str, payload: bytes) -> bytes | None:
        """The message's body, or None (refused and counted) when the run key's seal fails:
        unsigned, or sealed for another run instance (sim.protocol.seal)."""
        body = unseal(self.run_key, topic, payload)
        if body is None and self.run_key is not None:
            kind = refusal(self.run_key, topic, payload)
            why = "no valid run-key signature" if kind == UNSIGNED else "signed with the run key, for another run nonce"
            self.stats.refusals.refuse(kind, topic, why)
        return body

    def _receive_batch(self, topic: str, payload: bytes) -> BatchArrived | None:
        body = self._open(topic, payload)
        if body is None:
            return None
        try:
            batch = decode_batch(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.count_malformed("location events" if topic in self._places else "inbox", topic, exc)
            return None
        arrived = BatchArrived(batch.shard, batch.tick, topic, len(batch.events))
        if batch.tick < self._stale_before:
            self.stats.stale_batches += 1
            return arrived
        self.stats.events_in += len(batch.events)
        self._put(topic, batch.events)
        return arrived

    def deliver(self, topic: str, events: Iterable[AnyEvent]) -> None:
        """Deliver events this shard emitted on a topic it routes itself, from the objects:
        no encoding, no broker, no echo to wait for (the barrier waits for none of them)."""
        events = tuple(events)
        self._put(topic, events)
        self.stats.events_local += len(events)

    def _put(self, topic: str, events: Iterable[AnyEvent]) -> None:
        """A place's events into its intake (its listeners hear them from the place's log), an
        inbox's into the agent's mailbox."""
        place = self._places.get(topic)
        if place is not None:
            self.mail.to_place(place, events)
            return
        agent = self._inbox_agent(topic)
        if agent is None:
            raise ValueError(f"{topic}: not routed here")
        self.mail.to_inbox(agent, events)

    def _receive_barrier(self, topic: str, shard: str, payload: bytes) -> BarrierReceived | None:
        # A Hello is sealed before its sender knows the run nonce (sim.protocol.seal), and only a Hello may be.
        hello = None if self.run_key is None else self.run_key.open_unbound(topic, payload)
        body = hello if hello is not None else self._open(topic, payload)
        if body is None:
            return None
        try:
            message = decode_barrier(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.count_malformed("barrier", topic, exc)
            return None
        if hello is not None and not isinstance(message, Hello):
            self.stats.refusals.refuse(UNSIGNED, topic, "sealed without the run nonce, and not a Hello")
            return None
        if message.shard != shard:
            self.count_malformed("barrier", topic, ValueError(f"shard {message.shard!r} on another shard's topic"))
            return None
        return BarrierReceived(message)

    def _receive_outside(
        self, channel: Channel, topic: str, name: str, payload: bytes, retained: bool
    ) -> OutsideReceived | InputRefused | None:
        """Outside input on `channel`, read as the channel says; a refusal's error goes to the
        player the topic names when it is the sender's own topic, to the game system otherwise,
        with the message's `id` when one can be read. An empty payload on a channel that keeps
        nothing retained is how MQTT clears a retained message (`mosquitto_pub -r -n`): counted,
        never answered."""
        what, player = channel.what, name if channel.sender_named else None
        if not payload and not channel.retained:
            self.stats.refusals.refuse(f"empty {channel.publishers[0].acl} message (a retained one cleared)", topic,
                                       "an empty payload clears a retained message; it is no input")
            return None
        has_id = "id" in channel.payload.__struct_fields__
        if retained and not channel.retained:
            self.stats.refusals.refuse(f"retained {channel.publishers[0].acl} input", topic, retained_why(topic))
            return refused("retained", topic, "a retained message: only live input is taken", player=player,
                           input_id=id_in(payload) if has_id else None)
        if len(channel.parameters) > 1 and not is_name(name):
            why = f"{channel.parameters[-1]} id {name[:40]!r} is not a name ({NAME_RULE})"
            self.count_malformed(what, topic, ValueError(why))
            return refused("schema", topic, why, player=player, input_id=id_in(payload) if has_id else None)
        if channel.sender_named and name in topics.ROLE_LOGINS:
            why = f"{name!r} is an internal role's login, not a {channel.parameters[-1]}"
            self.stats.refusals.refuse(f"{what} as an internal role", topic, why)
            return refused("not_allowed", topic, why, player=player, input_id=id_in(payload) if has_id else None)
        try:
            message = channel.reader.decode(payload)
        except msgspec.DecodeError as exc:
            self.count_malformed(what, topic, exc)
            return refused(error_code(exc), topic, str(exc), player=player, input_id=id_in(payload) if has_id else None)
        problem = bound_problem(channel.bound, message, self.bounds)
        if problem is not None:
            assert channel.bound is not None
            self.stats.refusals.refuse(f"{what} {channel.bound.over}", topic, problem)
            npc = message.to if isinstance(message, PlayerInputMessage) else None
            return refused("too_long", topic, problem, player=player, npc=npc, input_id=getattr(message, "id", None))
        return OutsideReceived(channel.name, name, message, retained)


def retained_why(topic: str) -> str:
    """Why a retained message on `topic` is not taken, and how to clear it (one line)."""
    return (
        "the broker kept it from before this run subscribed (an earlier run, or a publish with retain); only live "
        f"messages are taken. Clear it with `mosquitto_pub -r -n -t {topic}`"
    )
