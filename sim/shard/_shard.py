"""`Shard`: one shard's agents, players and tick loop; `step(tick)` is one whole tick.

The tick is the clock, and a barrier for the whole run (sim.protocol.barrier). One tick,
`step(tick)`, in phases:
1. inputs: the world-state changes shard 0 took in the previous tick (announced in its
   TickDone, so every shard applies them at the same tick), scripted and bot players
   (functions of seed and tick) and outside clients' JSON that arrived before this point
   (stamped with this tick and stored) become events;
2. agents: the local agents that have mail from earlier ticks or roll to talk take their
   turn, concurrently, and the tick waits for all of them;
3. publish: the tick's outbox goes out as one sealed batch per topic, then the shard's
   TickDone listing them (with the world-state changes shard 0 took); everything sent is
   kept for re-sending;
4. barrier: until every shard finished the tick and every batch of it routed here
   arrived; a stall is logged and shown on the status topic, never skipped;
5. commit: the store commits the tick with what was sent in it, atomically.

`run(until)` steps tick after tick, paced by `tick_ms` on the clock, until `until` or a
stop. The bus hands the shard what it must act on as events (sim.bus), which the shard
takes at the phase boundaries and while it waits at the barrier; every wait is the clock's.

Resume (`--resume`) starts by passing the barrier of the last committed tick again: the
shard re-sends what it sent in that tick (from the store) and asks the others for theirs
(Join), so the events not yet perceived at the crash are in the mailboxes again.

Peers' requests are served within bounds (sim.protocol.admission): each Join once however
often it is replayed, and shard 0 answers each Hello (a shard asking for the run nonce,
sim.shard._instance) once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

import msgspec

from sim.bus import Connected
from sim.errors import ConfigError, single_error
from sim.memory import WorldFact
from sim.protocol.admission import Admission
from sim.protocol.barrier import Barrier, summarise
from sim.protocol.bounds import limit_player_inputs
from sim.protocol.received import BarrierReceived, BatchArrived, PlayerInputReceived, WorldStateReceived
from sim.protocol.router import retained_why
from sim.shard._config import parse_shard, shard_npcs
from sim.shard._context import ShardContext
from sim.shard._instance import kept_messages
from sim.shard._registry import Agent, Player, agent_factories, players
from sim.shard._startup import StartupPhase, create_agents
from sim.store import Store, Writer
from sim.wire import topics
from sim.wire.barrier import BarrierMessage, Hello, Join, TickDone, Welcome
from sim.wire.events import PlayerInputMessage, Speech, StatusMessage, WorldStateMessage, event_id
from sim.wire.trace import RosterEntry, RosterMessage

__all__ = ["Shard"]

log = logging.getLogger(__name__)

_BARRIER_POLL = 0.5  # seconds between looks at a held barrier (status, stall warning)


class Shard:
    """One shard of a run: `start()`, then `step(tick)` or `run(until)`, then `go_offline()`."""

    def __init__(self, ctx: ShardContext, stop: asyncio.Event) -> None:
        self.ctx, self.stop = ctx, stop
        self.config, self.bus, self.store, self.stats, self.clock = ctx.config, ctx.bus, ctx.store, ctx.stats, ctx.clock
        self.index, count = parse_shard(ctx.config.shard)
        self.specs = shard_npcs(ctx.scenario, self.index, count)
        self.local = frozenset(spec.id for spec in self.specs)
        self.agents: list[Agent] = []
        self.players: list[Player] = []
        self.outside: list[tuple[str, PlayerInputMessage]] = []
        self.world_updates: list[WorldStateMessage] = []  # shard 0: taken into its next TickDone
        self.world_due: dict[str, str] | None = None  # applied at the start of the next tick
        last = self.store.last_tick if self.config.resume else None
        self.first = 0 if last is None else last + 1
        self.next_tick = self.first
        ticks = self.config.ticks if self.config.ticks is not None else ctx.scenario.scenario.ticks
        self.end = self.config.until_tick if self.config.until_tick is not None else self.first + ticks
        self._session = secrets.token_hex(8)  # names this process's Joins (sim.wire.barrier.Join)
        self.barrier = self._barrier(count, self.first)
        self._resend_since: int | None = None
        self._admission = Admission()
        self._hellos: list[Hello] = []  # shard 0: to be answered with the run nonce

    # --- starting and stopping ---------------------------------------------------------

    async def start(self) -> None:
        """Load or create the agents, listen to their topics, join the run's barrier, say "online"."""
        ctx, bus, stats = self.ctx, self.bus, self.stats
        await self._restore_sent()
        bus.drop_batches_before(self.barrier.tick)
        await bus.listen_barrier()  # first: every batch is counted
        kinds = agent_factories(self.specs)
        self.agents = await create_agents(
            self.store, ctx.scenario, self.specs, stats.startup_progress,
            lambda spec: kinds[spec.kind](spec, ctx.agent_context(spec)),
        )
        stats.agents = len(self.agents)
        if ctx.metrics is not None:
            ctx.metrics.agents.set(len(self.agents))
        stats.startup_progress.enter(StartupPhase.SUBSCRIBING)
        npcs = tuple(RosterEntry(id=s.id, name=s.name, location=s.location) for s in self.specs)
        await bus.publish_roster(RosterMessage(run=ctx.run_id, shard=ctx.shard, npcs=npcs))
        by_location: dict[str, list[str]] = {}
        for spec in self.specs:
            by_location.setdefault(spec.location, []).append(spec.id)
        for location, ids in sorted(by_location.items()):
            await bus.listen_location(location, ids)
        await bus.listen_inboxes(sorted(self.local))
        if self.index == 0:
            self.players = players(ctx.scenario, ctx.run_id, ctx.seed, bots=self.config.bots,
                                   bot_rate=self.config.bot_rate)
        await bus.listen_player_input()
        if self.index == 0:
            await bus.listen_world_state()
        await self._rejoin()
        stats.first_tick, stats.last_tick, stats.tick = self.first, self.end - 1, self.first - 1
        if self.index == 0 and not self.config.resume and ctx.scenario.world:
            world = WorldStateMessage(state={w.key: w.value for w in ctx.scenario.world}, tick=self.first)
            await bus.publish_world_state(world)
        await self._status()

    async def go_offline(self) -> None:
        """Say "offline" on the status topic (retained): the run ended here, in order."""
        await self._status("offline")

    def _barrier(self, count: int, tick: int) -> Barrier:
        """Barrier messages are believed whole when authenticated: a run key, or a broker login."""
        config = self.bus.config
        trusted = config.run_key is not None or config.broker.username is not None
        return Barrier(self.ctx.shard, [str(i) for i in range(count)], self.bus.is_routed, tick=tick,
                       trusted=trusted, session=self._session)

    async def _restore_sent(self) -> None:
        """On resume: keep again what the last two committed ticks sent, and pass the last
        one's barrier again (the others re-send theirs: docs/topics.md, "The tick barrier")."""
        last = self.first - 1
        if last < 0:
            return
        sent = kept_messages(await self.store.sent(), self.bus.config.run_key, self.config)
        if not any(tick == last for tick, _, _ in sent):
            log.warning("%s: no record of what tick %d sent; its events are not perceived again", self.store.path, last)
            return
        self.barrier = self._barrier(len(self.barrier.shards), last)
        for tick, topic, payload in sent:
            self.barrier.keep(tick, topic, payload)

    # --- the ticks -----------------------------------------------------------------------

    async def run(self, until: int) -> None:
        """Step every tick before `until`, paced by `tick_ms`, unless asked to stop."""
        while self.next_tick < until and not self.stop.is_set():
            started = self.clock.now()
            if not await self.step(self.next_tick):
                return
            if self.config.tick_ms:
                await self.clock.sleep(self.config.tick_ms / 1000 - (self.clock.now() - started), self.stop)

    async def step(self, tick: int) -> bool:
        """One whole tick; False when asked to stop while the barrier held (the tick is not
        committed: the store rolls it back, and it runs again on --resume)."""
        if tick != self.next_tick:
            raise ValueError(f"shard {self.ctx.shard}: the next tick is {self.next_tick}, not {tick}")
        if self.barrier.tick < tick and not await self._pass_barrier(self.barrier.tick):
            return False  # a resumed shard passes its last committed tick's barrier again first
        started = self.clock.now()
        self.ctx.tick = self.stats.tick = tick
        await self._take_inputs(tick)
        await self._step_agents(tick)
        await self._publish(tick)
        if not await self._pass_barrier(tick):
            return False
        await self._commit(tick)
        self.next_tick = tick + 1
        if self.ctx.metrics is not None:
            self.ctx.metrics.tick_done(tick, self.clock.now() - started)
        return True

    async def _take_inputs(self, tick: int) -> None:
        """World-state changes, then the players' inputs of this tick, as events."""
        ctx, stats = self.ctx, self.stats
        if self.world_due:
            world = WorldStateMessage(state=self.world_due, tick=tick)
            stats.world_changes += await _apply_world_state(self.store, sorted(self.local), world)
        self.world_due = None
        for player in self.players:
            for event in player.inputs(tick):
                self._emit_player(player.location, event)
                stats.player_inputs += 1
        await self._take_bus_events()  # what arrived until now is this tick's input
        taken = limit_player_inputs(self.outside, self.config.bounds.player_inputs_per_tick, self.bus)
        self.outside.clear()
        for seq, (player_id, message) in enumerate(taken):
            await self.store.record_input(tick, seq, player_id, message.to, message.text)
            event = Speech(
                id=event_id(ctx.run_id, player_id, tick, 1_000_000 + seq),
                tick=tick,
                speaker=player_id,
                to=message.to,
                text=message.text,
                from_player=True,
            )
            ctx.outbox.emit(topics.agent_inbox(ctx.run_id, message.to), event)
            stats.player_inputs += 1

    async def _step_agents(self, tick: int) -> None:
        """Every agent with mail from earlier ticks, or that rolls to talk, takes its turn."""
        woken = [agent for agent in self.agents if agent.wants_turn(tick)]
        try:
            async with asyncio.TaskGroup() as group:
                for agent in woken:
                    group.create_task(agent.step(tick), name=f"agent-{agent.id}")
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None

    async def _publish(self, tick: int) -> None:
        """The tick's batches, then the TickDone that lists them; all kept for re-sending."""
        for batch in self.ctx.outbox.flush(tick):
            await self.bus.publish(batch.topic, batch.payload)
            self.barrier.keep(tick, batch.topic, batch.payload, events=batch.events)
        await self._take_bus_events()  # shard 0: the world-state changes that arrived until now
        world: dict[str, str] = {}
        for message in self.world_updates:  # in the order they arrived
            world.update(message.state)
        self.world_updates.clear()
        topic, payload = await self.bus.publish_barrier(self.barrier.finish(tick, world or None))
        self.barrier.keep(tick, topic, payload)

    async def _pass_barrier(self, tick: int) -> bool:
        """Until the barrier for `tick` passes; serve re-send requests; say who holds it up.

        False when asked to stop while held.
        """
        started, since = self.clock.now(), self.clock.wall()
        look = started + _BARRIER_POLL
        announced = ""
        warned = False
        while True:
            await self._take_bus_events()
            await self._serve_resends()
            if self.barrier.conflict is not None:
                raise ConfigError(f"--shard {self.config.shard}: {self.barrier.conflict}")
            if self.barrier.passed(tick):
                self.world_due = self.barrier.world(tick)
                break
            now = self.clock.now()
            if now >= look:
                if self.stop.is_set():
                    held = summarise(self.barrier.awaited(tick))
                    log.warning("stopping while tick %d waits for %s: it runs again on --resume", tick, held)
                    return False
                look = now + _BARRIER_POLL
                awaited = self.barrier.awaited(tick)
                awaiting = summarise(awaited)
                if self.ctx.metrics is not None:
                    self.ctx.metrics.awaited_shards.set(len(awaited))
                if awaiting != announced:
                    announced = awaiting
                    self.stats.awaiting, self.stats.awaiting_since = awaiting, started
                    await self._status(awaiting=awaiting, since=since)
                waited = now - started
                if waited >= self.config.echo_timeout and not warned:
                    warned = True
                    self.stats.stalls += 1
                    log.warning("tick %d: waiting for %s for %.1f s; the run holds until then", tick, awaiting, waited)
            await self.clock.wait(self.bus.arrived, look - now)
        self.barrier.advance(tick)
        self.bus.drop_batches_before(self.barrier.tick)
        if self.ctx.metrics is not None:
            self.ctx.metrics.awaited_shards.set(0)
        if tick > self.first:  # the first tick also waits for the other shards to start
            self.stats.barrier_seconds += self.clock.now() - started
            self.stats.barrier_ticks += 1
        if announced:
            self.stats.awaiting, self.stats.awaiting_since = "", None
            await self._status()
        return True

    async def _commit(self, tick: int) -> None:
        """The tick and what it sent, in one transaction; status every 10 ticks."""
        self.bus.report_overflow(tick)
        await self.store.keep_sent(self.barrier.kept_by_tick())
        await self.store.end_tick(tick)
        if self.config.retain_memories is not None:
            self.stats.memories_pruned += await self.store.prune_memories(self.config.retain_memories)
        if tick % 10 == 0:
            await self._status()

    # --- what the bus hands over ---------------------------------------------------------

    async def _take_bus_events(self) -> None:
        """Act on what arrived: batches and barrier messages, outside input, (re)connections."""
        rejoin = False
        for event in self.bus.take_events():
            match event:
                case BatchArrived(shard=shard, tick=tick, topic=topic, events=events):
                    self.barrier.batch_received(shard, tick, topic, events)
                case BarrierReceived(message=message):
                    self._on_barrier(message)
                case PlayerInputReceived(player=player, message=message):
                    self._on_player_input(player, message)
                case WorldStateReceived(message=message, retained=False):
                    self.world_updates.append(message)
                case WorldStateReceived(message=message, retained=True):
                    self._on_retained_world_state(message)
                case Connected(again=again):
                    rejoin = rejoin or again
        if rejoin:
            await self._rejoin()
        await self._welcome()

    def _on_player_input(self, player: str, message: PlayerInputMessage) -> None:
        if message.to not in self.local:
            if message.to not in self.ctx.npc_ids:
                self.bus.count_malformed(
                    "player input to an unknown NPC",
                    topics.player_input(self.ctx.run_id, player),
                    ValueError(f"no NPC {message.to!r} in this run"),
                )
            return
        self.outside.append((player, message))

    def _on_retained_world_state(self, message: WorldStateMessage) -> None:
        """Not applied: a fresh run is not changed by what an earlier one left on the broker,
        and a resumed one holds what it applied. Counted and said once when it differs from
        the world of this shard's NPCs."""
        unheld = dict(message.state)
        for agent in self.local:
            for entry in self.store.state(agent).world_state:
                if unheld.get(entry.key) == entry.value:
                    del unheld[entry.key]
            if not unheld:
                return
        topic = topics.world_state(self.ctx.run_id)
        self.bus.refuse("retained world state", topic, retained_why(topic))

    def _on_barrier(self, message: BarrierMessage) -> None:
        match message:
            case TickDone():
                self.barrier.done_received(message)
            case Join() if self._from_peer(message):
                if self._admitted(message.shard, ("join", message.session, message.seq)):
                    since = message.tick if self._resend_since is None else min(self._resend_since, message.tick)
                    self._resend_since = since
            case Hello() if self.index == 0 and self._from_peer(message):
                if self._admitted(message.shard, ("hello", message.challenge)):
                    self._hellos.append(message)
            case Join() | Hello() | Welcome():
                pass  # our own, a Hello for shard 0, a Welcome for a shard learning the nonce

    def _from_peer(self, message: Join | Hello) -> bool:
        """Another shard of this run, of the same shard count (else counted, or the conflict)."""
        if message.shard == self.barrier.shard:
            return False
        ignored = self.barrier.ignored_conflicts
        if self.barrier.same_run(message):
            return message.shard in self.barrier.shards
        if self.barrier.ignored_conflicts > ignored:
            self.bus.refuse("unauthenticated shard count conflict", topics.barrier(self.ctx.run_id, message.shard),
                            f"a Join of shard {message.shard} as {message.shard}/{message.shards} on a broker with "
                            "neither login nor run key; only a TickDone with another count stops the run")
        return False

    def _admitted(self, peer: str, name: tuple[str | int, ...]) -> bool:
        if self._admission.admit(peer, name, self.barrier.tick):
            return True
        self.bus.refuse("repeated barrier request", topics.barrier(self.ctx.run_id, peer),
                        "served once already, or the peer's requests for this tick are used up")
        return False

    async def _welcome(self) -> None:
        """Shard 0: tell each shard that said Hello the run nonce, sealed with it."""
        hellos, self._hellos = self._hellos, []
        key = self.bus.config.run_key
        nonce = None if key is None else key.nonce
        if nonce is None:
            return
        for hello in hellos:
            await self.bus.publish_barrier(
                Welcome(shard=self.ctx.shard, shards=len(self.barrier.shards), challenge=hello.challenge,
                        nonce=nonce.hex())
            )

    async def _rejoin(self) -> None:
        """After (re)connecting: re-send everything kept, then ask the others for theirs."""
        for topic, payload in self.barrier.kept(0):
            await self.bus.publish(topic, payload)
        await self.bus.publish_barrier(self.barrier.join())

    async def _serve_resends(self) -> None:
        since, self._resend_since = self._resend_since, None
        if since is not None:
            for topic, payload in self.barrier.kept(since):
                await self.bus.publish(topic, payload)

    # --- helpers ---------------------------------------------------------------------------

    def _emit_player(self, location: str | None, event: Speech) -> None:
        """A player standing at the NPC's place is overheard there; otherwise it is a direct message."""
        ctx = self.ctx
        if event.to is None:
            raise ValueError(f"player event {event.id!r} has no addressee")
        if location is not None and location == ctx.npc_location.get(event.to):
            ctx.outbox.emit(ctx.location_topic(location), event)
        else:
            ctx.outbox.emit(topics.agent_inbox(ctx.run_id, event.to), msgspec.structs.replace(event, location=None))

    async def _status(self, state: str = "online", *, awaiting: str | None = None, since: float | None = None) -> None:
        tick = self.stats.tick if self.stats.tick >= 0 else self.first
        message = StatusMessage(
            run=self.ctx.run_id, shard=self.ctx.shard, state=state, tick=tick, awaiting=awaiting, since=since
        )
        await self.bus.publish_status(message)


async def _apply_world_state(store: Store, agents: list[str], message: WorldStateMessage) -> int:
    """Set what the game system changed, with its authority; returns how many entries changed."""
    changed = 0
    for agent in agents:
        current = {entry.key: entry.value for entry in store.state(agent).world_state}
        for key, value in sorted(message.state.items()):
            if current.get(key) != value:
                await store.set_world(agent, WorldFact(key=key, value=value), writer=Writer.GAME)
                changed += 1
    return changed
