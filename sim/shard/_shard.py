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
3. publish: the tick's outbox, one batch per topic: a batch for this shard's own places
   or NPCs is delivered here from the objects (no broker, no echo to wait for), the others
   are sealed and published, then the shard's TickDone listing those (with the world-state
   changes shard 0 took); everything published is kept for re-sending;
4. barrier: until every shard finished the tick and every batch of it a peer published
   for this shard arrived (none to wait for on one shard); a stall is logged and shown on
   the status topic, never skipped;
5. perceive: each of this shard's places appends the tick's events to its log, once
   (sim.shard._perception), and the store gets one row per place; what was said to an
   NPC there is its mail for the next tick;
6. commit: the store commits the tick with what was sent in it and what waits for the next
   one (inbox mail, world-state changes), atomically.

A stop request ends the tick between slices of its work (the dice, the turns, the barrier)
and the tick is not committed. `run(until)` steps tick after tick, paced by `tick_ms` on
the clock, until `until` or a stop, writing each tick's commit while the next tick's turns
are taken. The bus hands the shard what it must act on as events (sim.bus), which the
shard takes at the phase boundaries and while it waits at the barrier; every wait is the
clock's.

Resume (`--resume`) finds in the store what the last committed tick left for the next:
the places' logs and the mail said there to this shard's NPCs, the inbox mail, the
world-state changes due; it re-sends what it published in that tick (what this start's
run key opens: sim.shard._instance) and the `say` lines the broker had not acknowledged
when it committed (lines of a committed tick are not said again, so they would be lost
with the outbox), and joins the run at the next one (Join), the others re-sending theirs.

Peers' requests are served within bounds (sim.protocol.admission): each Join once however
often it is replayed, the re-sends Joins ask for at most once per peer per second (more
are folded into the next, never dropped), and shard 0 answers each Hello (a shard asking
for the run nonce, sim.shard._instance) once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Iterable
from typing import Literal

import msgspec

from sim.bus import Connected
from sim.errors import ConfigError
from sim.memory import WorldFact
from sim.protocol.admission import Admission, Resends
from sim.protocol.barrier import Barrier, summarise
from sim.protocol.bounds import limit_player_inputs
from sim.protocol.received import BarrierReceived, BatchArrived, PlayerInputReceived, WorldStateReceived
from sim.protocol.router import retained_why
from sim.protocol.seal import peel
from sim.shard._clock import checkpoint
from sim.shard._context import ShardContext
from sim.shard._instance import kept_messages
from sim.shard._recorded import RecordedInputs
from sim.shard._registry import Player, players
from sim.shard._startup import StartupPhase, create_agents, in_thread
from sim.shard._turns import take_turns
from sim.store import Pending, PlayerArrival, Store, WorldArrival, Writer
from sim.wire import topics
from sim.wire.barrier import BarrierMessage, Hello, Join, TickDone, Welcome, decode_barrier
from sim.wire.events import PlayerInputMessage, Speech, StatusMessage, WorldStateMessage, decode_batch, event_id
from sim.wire.trace import RosterEntry, RosterMessage

__all__ = ["Shard"]

log = logging.getLogger(__name__)

_BARRIER_POLL = 0.5  # seconds between looks at a held barrier (status, stall warning)
_DICE_SLICE = 20_000  # NPCs' ambient dice rolled between two yields to the event loop (~20 ms)
_DELIVERY_SLICE = 5_000  # events delivered locally between two yields
_PLACE_SLICE = 500  # places' logs appended between two yields
_WORLD_SLICE = 20_000  # NPCs whose world state is set between two yields
_RESEND_INTERVAL = 1.0  # seconds: at most one re-send per peer in this time, however many Joins it sends


class Shard:
    """One shard of a run: `start()`, then `step(tick)` or `run(until)`, then `go_offline()`."""

    def __init__(self, ctx: ShardContext, stop: asyncio.Event, recorded: RecordedInputs | None = None) -> None:
        """`recorded`: a re-execution's outside inputs and world-state changes (sim.replay),
        taken at their ticks instead of what arrives on the bus."""
        self.ctx, self.stop = ctx, stop
        self.recorded = recorded
        self.config, self.bus, self.store, self.stats, self.clock = ctx.config, ctx.bus, ctx.store, ctx.stats, ctx.clock
        layout = ctx.layout
        self.index, self.count = layout.index, layout.count
        self.specs, self.local, self.dice = layout.specs, layout.local, layout.dice
        self._since: dict[str, int] = {}  # each place's first tick its log needs, as last stored
        self.players: list[Player] = []
        self.outside: list[tuple[str, PlayerInputMessage]] = []
        self.world_updates: list[WorldStateMessage] = []  # shard 0: taken into its next TickDone
        self.world_due: dict[str, str] | None = None  # applied at the start of the next tick
        last = self.store.last_tick if self.config.record.resume else None
        self.first = 0 if last is None else last + 1
        self.next_tick = self.first
        ticks = self.config.ticks if self.config.ticks is not None else ctx.scenario.scenario.ticks
        self.end = self.config.until_tick if self.config.until_tick is not None else self.first + ticks
        self._session = secrets.token_hex(8)  # names this process's Joins (sim.wire.barrier.Join)
        self.barrier = self._barrier(self.count, self.first)
        self._workers = 2 * self.config.inference.concurrency  # the pool always has turns waiting to order
        self._committing: asyncio.Future[None] | None = None  # the last tick's commit, on its way to disk
        self._admission = Admission()
        # outside input is journaled as it arrives, stamped with the tick that takes it
        # (sim.store._arrivals): player input with the tick whose inputs are still open,
        # world state with the tick whose TickDone still takes it; each moves on at the
        # moment its phase takes what arrived
        self._input_tick = self._world_tick = self.first
        self._held_inputs: dict[int, list[tuple[str, PlayerInputMessage]]] = {}  # a resume's, by tick
        self._held_world: dict[int, list[WorldStateMessage]] = {}
        self._resends = Resends(interval=_RESEND_INTERVAL)
        self._hellos: list[Hello] = []  # shard 0: to be answered with the run nonce

    # --- starting and stopping ---------------------------------------------------------

    async def start(self) -> None:
        """Load or create the agents, listen to their topics, join the run's barrier, say "online"."""
        ctx, bus, stats = self.ctx, self.bus, self.stats
        bus.drop_batches_before(self.barrier.tick)
        await bus.listen_barrier()  # first: every batch is counted
        loaded = await create_agents(self.store, ctx.scenario, self.specs, stats.startup_progress)
        stats.agents = loaded
        if ctx.metrics is not None:
            ctx.metrics.agents.set(loaded)
        stats.startup_progress.enter(StartupPhase.SUBSCRIBING)
        specs = self.specs  # the roster of a million NPCs takes a second to build: off the loop
        npcs = await in_thread(lambda: tuple(RosterEntry(id=s.id, name=s.name, location=s.location) for s in specs),
                               "npcsim-roster")
        await bus.publish_roster(RosterMessage(run=ctx.run_id, shard=ctx.shard, npcs=npcs))
        for location, ids in sorted(ctx.layout.places.items()):
            await bus.listen_location(location, ids)
        await bus.listen_inboxes(self.local)
        await self._restore()
        if self.index == 0:
            self.players = players(ctx.scenario, ctx.run_id, ctx.seed, bots=self.config.bots,
                                   bot_rate=self.config.bot_rate)
        self._restore_arrivals()
        bus.keep_outside(self._arrived)
        await bus.listen_player_input()
        if self.index == 0:
            await bus.listen_world_state()
        await self._rejoin()
        stats.first_tick, stats.last_tick, stats.tick = self.first, self.end - 1, self.first - 1
        if self.index == 0 and not self.config.record.resume and ctx.scenario.world:
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

    async def _restore(self) -> None:
        """On resume: what the last committed tick left for the next one, from the store: the
        places' logs (and what was said there to this shard's NPCs), the inboxes' mail, the
        world-state changes due, and what the shard sent (to re-send, what this start's key
        opens; the others re-send theirs when it joins: docs/topics.md, "The tick barrier")."""
        last = self.first - 1
        if last < 0:
            return
        sent = await self.store.sent()
        for tick, topic, payload in kept_messages(sent, self.bus.config.run_key, self.config):
            self.barrier.keep(tick, topic, payload)
        for topic, payload in await self.store.says():  # lines said that may never have left
            await self.bus.publish(topic, payload)
        if self.store.migrated_at == last:
            await self._restore_schema_3(last, sent)
        else:
            perception = self.ctx.perception
            for place, rows in (await self.store.place_log()).items():
                for tick, events in rows:
                    perception.append(place, events, mail=tick == last)
                await checkpoint()
            pending = await self.store.pending()
            self.bus.restore_mail(pending.mail)
            self.world_due = pending.world
        self._since = self.ctx.perception.fronts()

    def _restore_arrivals(self) -> None:
        """What arrived for a tick that was not committed (cut short by kill -9): taken at
        the tick it was stamped with, before what arrives in this process for that tick."""
        for arrival in self.store.pending_arrivals:
            match arrival:
                case PlayerArrival(tick=tick, player=player, to=to, text=text):
                    self._held_inputs.setdefault(tick, []).append((player, PlayerInputMessage(to=to, text=text)))
                case WorldArrival(tick=tick, state=state):
                    self._held_world.setdefault(tick, []).append(WorldStateMessage(state=state, tick=tick))

    def _arrived(self, event: PlayerInputReceived | WorldStateReceived) -> None:
        """Journal an outside input this shard takes, as the bus receives it."""
        match event:
            case PlayerInputReceived(player=player, message=message) if message.to in self.local:
                self.store.arrive(PlayerArrival(tick=self._input_tick, player=player, to=message.to, text=message.text))
            case WorldStateReceived(message=message, retained=False) if self.index == 0:
                self.store.arrive(WorldArrival(tick=self._world_tick, state=dict(message.state)))
            case _:
                pass

    async def _restore_schema_3(self, last: int, sent: list[tuple[int, str, bytes]]) -> None:
        """A store last written by npcsim before schema 4: its NPCs' memories of what they
        heard are their own rows, and what the last tick said is only in what it sent
        (its own batches came back through the broker then). So those batches are
        delivered here and appended to the places' logs, as the barrier of that tick would
        (read back whatever sealed them: the key of that start, before run nonces, is gone).
        Such a store resumes on one shard only (sim.shard._config.check_resume)."""
        for tick, topic, payload in sent:
            if tick != last:
                continue
            body = peel(payload)
            if topic == topics.barrier(self.ctx.run_id, self.ctx.shard):
                done = decode_barrier(body)
                if isinstance(done, TickDone) and done.tick == last:
                    self.world_due = done.world
            elif self.bus.is_routed(topic):
                self.bus.deliver(topic, decode_batch(body).events)
        await self._perceive(last)

    # --- the ticks -----------------------------------------------------------------------

    async def run(self, until: int) -> None:
        """Step every tick before `until`, paced by `tick_ms`, unless asked to stop.

        A tick's commit is written by SQLite (in its own thread) while the next tick's inputs
        and turns are taken; that tick publishes its TickDone only once the commit is on
        disk, so every shard still commits t-1 before anyone sends t's TickDone.
        """
        try:
            while self.next_tick < until and not self.stop.is_set():
                started = self.clock.now()
                if not await self._step(self.next_tick):
                    return
                if self.config.tick_ms:
                    await self.clock.sleep(self.config.tick_ms / 1000 - (self.clock.now() - started), self.stop)
        finally:
            await self._committed()

    async def step(self, tick: int) -> bool:
        """One whole tick, committed when it returns True; False when asked to stop before it
        was done (the tick is not committed: the store rolls it back, it runs again on --resume)."""
        try:
            return await self._step(tick)
        finally:
            await self._committed()

    async def _step(self, tick: int) -> bool:
        """One tick, its commit queued (`run`)."""
        if tick != self.next_tick:
            raise ValueError(f"shard {self.ctx.shard}: the next tick is {self.next_tick}, not {tick}")
        started = self.clock.now()
        self.ctx.tick = self.stats.tick = tick
        await self._take_inputs(tick)
        if not await self._take_turns(tick):
            log.warning("stopping during tick %d: it is not committed and runs again on --resume", tick)
            return False
        await self._committed()  # the last tick is on disk before this one's TickDone goes out
        await self._publish(tick)
        if not await self._pass_barrier(tick):
            return False
        await self._perceive(tick)
        await self._commit(tick)
        self.next_tick = tick + 1
        self.stats.ticks_done += 1
        if self.ctx.metrics is not None:
            self.ctx.metrics.tick_done(tick, self.clock.now() - started)
        return True

    async def _committed(self) -> None:
        """Until the last tick's commit is on disk (it raises what the writer met)."""
        committing, self._committing = self._committing, None
        if committing is not None:
            await committing

    async def _take_inputs(self, tick: int) -> None:
        """World-state changes, then the players' inputs of this tick, as events."""
        ctx, stats = self.ctx, self.stats
        if self.recorded is not None:
            self.world_due = self.recorded.world.get(tick)
        if self.world_due:
            world = WorldStateMessage(state=self.world_due, tick=tick)
            stats.world_changes += await _apply_world_state(self.store, (s.id for s in self.specs), world)
            await self.store.record_world(tick, self.world_due)
        self.world_due = None
        for player in self.players:
            for event in player.inputs(tick):
                self._emit_player(player.location, event)
                stats.player_inputs += 1
        await self._take_bus_events(taking="input")  # what arrived until now is this tick's input
        for seq, player_id, to, text in self._outside_inputs(tick):
            await self.store.record_input(tick, seq, player_id, to, text)
            event = Speech(
                id=event_id(ctx.run_id, player_id, tick, 1_000_000 + seq),
                tick=tick,
                speaker=player_id,
                to=to,
                text=text,
                from_player=True,
            )
            ctx.outbox.emit(topics.agent_inbox(ctx.run_id, to), event)
            stats.player_inputs += 1

    def _outside_inputs(self, tick: int) -> list[tuple[int, str, str, str]]:
        """This tick's outside inputs, (seq, player, NPC, text): what arrived (a resume's journaled
        arrivals first), within its bound, or in a re-execution what the run took at this tick,
        with the numbers it gave them."""
        inputs = self._held_inputs.pop(tick, []) + self.outside
        taken = limit_player_inputs(inputs, self.config.limits.bounds.player_inputs_per_tick, self.bus)
        self.outside.clear()
        if self.recorded is not None:
            return [i for i in self.recorded.inputs.get(tick, ()) if i[2] in self.local]
        return [(seq, player, message.to, message.text) for seq, (player, message) in enumerate(taken)]

    async def _take_turns(self, tick: int) -> bool:
        """The NPCs with mail from earlier ticks, then those whose ambient dice fell, take
        their turns; no other NPC is touched. False when asked to stop first."""
        fallen: list[str] = []
        for start in range(0, len(self.dice), _DICE_SLICE):
            if self.stop.is_set():
                return False
            fallen += self.dice.roll(tick, start, start + _DICE_SLICE)
            await checkpoint()
        mailed = sorted({*self.bus.mail_holders(tick), *self.ctx.perception.mail_holders()})
        ambient = set(fallen)
        woken = {agent: agent in ambient for agent in mailed}  # players' answers go to the pool first
        woken.update((agent, True) for agent in fallen)
        ctx = self.ctx

        async def turn(item: tuple[str, bool]) -> None:
            spec = ctx.layout.by_id[item[0]]
            await ctx.kinds[spec.kind].build(spec, ctx.agent_context(spec)).step(tick, item[1])

        return await take_turns(woken.items(), turn, workers=self._workers, stop=self.stop)

    async def _publish(self, tick: int) -> None:
        """The tick's batches for this shard's own places and NPCs delivered here, the others
        published; then the TickDone that lists those, all of it kept for re-sending."""
        outbox, delivered = self.ctx.outbox, 0
        for batch in outbox.take():
            if self.bus.is_routed(batch.topic):
                self.bus.deliver(batch.topic, batch.events)
                delivered += len(batch.events)
                if delivered >= _DELIVERY_SLICE:
                    delivered = 0
                    await checkpoint()
                continue
            sealed = outbox.seal(tick, batch)
            await self.bus.publish(sealed.topic, sealed.payload)
            self.barrier.keep(tick, sealed.topic, sealed.payload, events=sealed.events)
        await self._take_bus_events(taking="world")  # shard 0: the world-state changes that arrived until now
        world: dict[str, str] = {}
        for message in self._held_world.pop(tick, []) + self.world_updates:  # in the order they arrived
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
                if waited >= self.config.limits.echo_timeout and not warned:
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

    async def _perceive(self, tick: int) -> None:
        """The tick's events at each of this shard's places into the place's log, once, and into
        the store as one row per place (with the tick from which the place's log is needed,
        when its window moved); what was said to an NPC there is its mail for the next tick."""
        perception, since = self.ctx.perception, self._since
        for n, (place, events) in enumerate(self.bus.take_place_events(tick), start=1):
            perception.append(place, events)
            front = perception.front_tick(place)
            moved = front if front is not None and front != since.get(place) else None
            if moved is not None:
                since[place] = moved
            await self.store.add_place_events(place, tick, events, since=moved)
            if n % _PLACE_SLICE == 0:
                await checkpoint()

    async def _commit(self, tick: int) -> None:
        """The tick, what it sent and what waits for the next one, in one transaction; status
        every 10 ticks."""
        self.bus.report_overflow(tick)
        await self.store.keep_sent(self.barrier.kept_by_tick())
        await self.store.keep_says(self.bus.unsent_says())
        await self.store.keep_pending(Pending(mail=self.bus.waiting_mail(tick), world=self.world_due))
        await self.store.sync_arrivals()  # what this tick took is on the disk before it commits
        self._committing = await self.store.queue_end_tick(tick)
        if self.config.record.retain_memories is not None:
            await self._committed()
            self.stats.memories_pruned += await self.store.prune_memories(self.config.record.retain_memories)
        if tick % 10 == 0:
            await self._status()

    # --- what the bus hands over ---------------------------------------------------------

    async def _take_bus_events(self, taking: Literal["input", "world"] | None = None) -> None:
        """Act on what arrived: batches and barrier messages, outside input, (re)connections.

        `taking`: the phase that takes the outside input (or world state) that arrived until
        now; what arrives from this moment on is stamped for the next tick."""
        rejoin = False
        arrived = self.bus.take_events()
        if taking == "input":
            self._input_tick = self.ctx.tick + 1
        elif taking == "world":
            self._world_tick = self.ctx.tick + 1
        for event in arrived:
            match event:
                case BatchArrived(shard=shard, tick=tick, topic=topic, events=events):
                    self.barrier.batch_received(shard, tick, topic, events)
                case BarrierReceived(message=message):
                    self._on_barrier(message)
                case PlayerInputReceived(player=player, message=message):
                    self._on_player_input(player, message)
                case WorldStateReceived(message=message, retained=False) if self.recorded is None:
                    self.world_updates.append(message)
                case WorldStateReceived(retained=False):
                    pass  # a re-execution takes the run's world-state changes at their ticks
                case WorldStateReceived(message=message, retained=True):
                    self._on_retained_world_state(message)
                case Connected(again=again):
                    rejoin = rejoin or again
        if rejoin:
            await self._rejoin()
        await self._welcome()

    def _on_player_input(self, player: str, message: PlayerInputMessage) -> None:
        if message.to not in self.local:
            if message.to not in self.ctx.npc_location:
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
        world_value = self.store.world_value  # no state built for each of a shard's NPCs
        for agent in self.local:
            for key in [key for key, value in unheld.items() if world_value(agent, key) == value]:
                del unheld[key]
            if not unheld:
                return
        topic = topics.world_state(self.ctx.run_id)
        self.bus.refuse("retained world state", topic, retained_why(topic))

    def _on_barrier(self, message: BarrierMessage) -> None:
        match message:
            case TickDone():
                self.barrier.done_received(message)
            case Join() if self._from_peer(message):
                if self._admission.first(message.shard, ("join", message.session, message.seq)):
                    self._resends.request(message.shard, message.tick, self.clock.now())
                    self.stats.resends_folded = self._resends.folded
                else:
                    self._refuse_repeated(message.shard)
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
        self._refuse_repeated(peer)
        return False

    def _refuse_repeated(self, peer: str) -> None:
        self.bus.refuse("repeated barrier request", topics.barrier(self.ctx.run_id, peer),
                        "served once already, or the peer's requests for this tick are used up")

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
        """Re-send what peers' Joins asked for, at most once per peer and interval
        (sim.protocol.admission.Resends); say once per interval how many were folded."""
        now = self.clock.now()
        resends = self._resends
        since = resends.due(now)
        if since is not None:
            self.stats.resends = resends.resends
            if self.ctx.metrics is not None:
                self.ctx.metrics.resends.inc()
            for topic, payload in self.barrier.kept(since):
                await self.bus.publish(topic, payload)
        folded = resends.report(now)
        if folded:
            if self.ctx.metrics is not None:
                self.ctx.metrics.resends_folded.inc(sum(folded.values()))
            detail = ", ".join(f"{n} of shard {peer}" for peer, n in sorted(folded.items()))
            log.warning("Join requests folded into later re-sends (one per peer per %g s): %s", resends.interval,
                        detail)

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


async def _apply_world_state(store: Store, agents: Iterable[str], message: WorldStateMessage) -> int:
    """Set what the game system changed, with its authority; returns how many entries changed.

    Every NPC is looked at (each holds its own world state), in slices between yields."""
    changed = 0
    entries = sorted(message.state.items())
    for n, agent in enumerate(agents, start=1):
        for key, value in entries:
            if store.world_value(agent, key) != value:
                await store.set_world(agent, WorldFact(key=key, value=value), writer=Writer.GAME)
                changed += 1
        if n % _WORLD_SLICE == 0:
            await checkpoint()
    return changed
