"""`Shard`: one shard's agents, players and tick loop; `step(tick)` is one whole tick.

The tick is the clock, and a barrier for the whole run (sim.protocol.barrier). One tick,
`step(tick)`, in phases:
1. inputs: the world-state changes shard 0 took in the previous tick (announced in its
   TickDone, so every shard applies them at the same tick), scripted and bot players
   (functions of seed and tick) and outside clients' JSON that arrived before this point
   (stamped with this tick and stored) become events;
2. turns: the local NPCs that have mail from earlier ticks or whose ambient dice fell
   (rolled here, for every local NPC: sim.shard._dice) take their turn, stepped by a
   bounded set of workers (sim.shard._turns); no other NPC is touched;
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
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from sim.bus import Connected
from sim.errors import ConfigError
from sim.memory import WorldFact
from sim.protocol.barrier import Barrier
from sim.protocol.bounds import limit_player_inputs
from sim.protocol.received import BarrierReceived, BatchArrived, PlayerInputReceived, WorldStateReceived
from sim.shard._clock import checkpoint
from sim.shard._config import parse_shard, shard_npcs
from sim.shard._context import ShardContext
from sim.shard._dice import AmbientDice
from sim.shard._registry import AgentFactory, Player, agent_factories, players
from sim.shard._startup import StartupPhase, create_agents
from sim.shard._turns import take_turns
from sim.store import Store, Writer
from sim.wire import topics
from sim.wire.barrier import BarrierMessage, Join
from sim.wire.events import PlayerInputMessage, Speech, StatusMessage, WorldStateMessage, event_id
from sim.wire.trace import RosterEntry, RosterMessage

__all__ = ["Shard"]

log = logging.getLogger(__name__)

_BARRIER_POLL = 0.5  # seconds between looks at a held barrier (status, stall warning)
_DICE_SLICE = 20_000  # NPCs' ambient dice rolled between two yields to the event loop (~20 ms)


class Shard:
    """One shard of a run: `start()`, then `step(tick)` or `run(until)`, then `go_offline()`."""

    def __init__(self, ctx: ShardContext, stop: asyncio.Event) -> None:
        self.ctx, self.stop = ctx, stop
        self.config, self.bus, self.store, self.stats, self.clock = ctx.config, ctx.bus, ctx.store, ctx.stats, ctx.clock
        self.index, count = parse_shard(ctx.config.shard)
        self.specs = shard_npcs(ctx.scenario, self.index, count)
        self.local = frozenset(spec.id for spec in self.specs)
        self.kinds: dict[str, AgentFactory] = {}
        self.dice = AmbientDice(ctx.seed, self.specs)
        self.players: list[Player] = []
        self.outside: list[tuple[str, PlayerInputMessage]] = []
        self.world_updates: list[WorldStateMessage] = []  # shard 0: taken into its next TickDone
        self.world_due: dict[str, str] | None = None  # applied at the start of the next tick
        last = self.store.last_tick if self.config.resume else None
        self.first = 0 if last is None else last + 1
        self.next_tick = self.first
        ticks = self.config.ticks if self.config.ticks is not None else ctx.scenario.scenario.ticks
        self.end = self.config.until_tick if self.config.until_tick is not None else self.first + ticks
        self.barrier = Barrier(ctx.shard, [str(i) for i in range(count)], self.bus.is_routed, tick=self.first)
        self._workers = 2 * self.config.concurrency  # the pool always has turns waiting to order
        self._resend_since: int | None = None

    # --- starting and stopping ---------------------------------------------------------

    async def start(self) -> None:
        """Load or create the agents, listen to their topics, join the run's barrier, say "online"."""
        ctx, bus, stats = self.ctx, self.bus, self.stats
        await self._restore_sent()
        bus.drop_batches_before(self.barrier.tick)
        await bus.listen_barrier()  # first: every batch is counted
        self.kinds = agent_factories(self.specs)
        loaded = await create_agents(self.store, ctx.scenario, self.specs, stats.startup_progress, lambda _: None)
        stats.agents = len(loaded)
        if ctx.metrics is not None:
            ctx.metrics.agents.set(len(loaded))
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

    async def _restore_sent(self) -> None:
        """On resume: keep again what the last two committed ticks sent, and pass the last
        one's barrier again (the others re-send theirs: docs/topics.md, "The tick barrier")."""
        last = self.first - 1
        if last < 0:
            return
        sent = await self.store.sent()
        if not any(tick == last for tick, _, _ in sent):
            log.warning("%s: no record of what tick %d sent; its events are not perceived again", self.store.path, last)
            return
        self.barrier = Barrier(self.barrier.shard, self.barrier.shards, self.bus.is_routed, tick=last)
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
        """One whole tick; False when asked to stop before it was done (the tick is not
        committed: the store rolls it back, and it runs again on --resume)."""
        if tick != self.next_tick:
            raise ValueError(f"shard {self.ctx.shard}: the next tick is {self.next_tick}, not {tick}")
        if self.barrier.tick < tick and not await self._pass_barrier(self.barrier.tick):
            return False  # a resumed shard passes its last committed tick's barrier again first
        started = self.clock.now()
        self.ctx.tick = self.stats.tick = tick
        await self._take_inputs(tick)
        if not await self._take_turns(tick):
            log.warning("stopping during tick %d: it is not committed and runs again on --resume", tick)
            return False
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

    async def _take_turns(self, tick: int) -> bool:
        """The NPCs with mail from earlier ticks, then those whose ambient dice fell, take
        their turns; no other NPC is touched. False when asked to stop first."""
        fallen: list[str] = []
        for start in range(0, len(self.dice), _DICE_SLICE):
            if self.stop.is_set():
                return False
            fallen += self.dice.roll(tick, start, start + _DICE_SLICE)
            await checkpoint()
        mailed = self.bus.mail_holders(tick)
        ambient = set(fallen)
        woken = {agent: agent in ambient for agent in mailed}  # players' answers go to the pool first
        woken.update((agent, True) for agent in fallen)
        scenario, kinds, ctx = self.ctx.scenario, self.kinds, self.ctx

        async def turn(item: tuple[str, bool]) -> None:
            spec = scenario.npc(item[0])
            await kinds[spec.kind](spec, ctx.agent_context(spec)).step(tick, item[1])

        return await take_turns(woken.items(), turn, workers=self._workers, stop=self.stop)

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
                    held = ", ".join(self.barrier.awaited(tick))
                    log.warning("stopping while tick %d waits for %s: it runs again on --resume", tick, held)
                    return False
                look = now + _BARRIER_POLL
                awaited = self.barrier.awaited(tick)
                awaiting = ", ".join(awaited)
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
                case WorldStateReceived(message=message):
                    self.world_updates.append(message)
                case Connected(again=again):
                    rejoin = rejoin or again
        if rejoin:
            await self._rejoin()

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

    def _on_barrier(self, message: BarrierMessage) -> None:
        if isinstance(message, Join):
            if message.shard != self.barrier.shard and self.barrier.same_run(message):
                since = message.tick if self._resend_since is None else min(self._resend_since, message.tick)
                self._resend_since = since
            return
        self.barrier.done_received(message)

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
