"""`Shard`: one shard's agents, players and tick loop; `step(tick)` is one whole tick.

The tick is the clock, and a barrier for the whole run (sim.protocol.barrier). One tick,
`step(tick)`, is six phases, each the call of the object that owns its state:
1. inputs (`TickInputs`, sim.shard._inputs): the world-state changes due, the scripted
   and bot players' inputs and the outside input of the tick's input source (live: what
   arrived on the bus; a re-execution: what the run took), as events;
2. turns (`Turns`, sim.shard._turns): the local NPCs with mail from earlier ticks, or with
   an outside player's input this tick took (answered at once: sim.shard._early), or whose
   ambient dice fell take their turn; no other NPC is touched;
3. publish (`Publisher`, sim.shard._exchange): the tick's outbox, delivered here or sealed
   and published, then the shard's TickDone; all of it kept for re-sending;
4. barrier (`BarrierWait`, sim.shard._exchange): until every shard finished the tick and
   every batch of it for this shard arrived;
5. perceive (`Perception`, sim.shard._perception): each of this shard's places appends the
   tick's events to its log, once, and the store gets one row per place;
6. commit (`Store.commit_tick`): the tick with what it sent and what waits for the next
   one (inbox mail, world-state changes), atomically.

What the bus hands over between phases is taken by `Intake` (sim.shard._intake): batches
and barrier messages, peers' requests (sim.protocol.admission), outside input. A stop
request ends the tick between slices of its work (the dice, the turns, the barrier) and
the tick is not committed. `run(until)` steps tick after tick, paced by `tick_ms` on the
clock (sim.shard._pace: sooner when outside input waits for the next tick), writing each
tick's commit while the next tick's inputs and turns are taken.

Resume (`--resume`) finds in the store what the last committed tick left for the next:
the places' logs and the mail said there to this shard's NPCs, the inbox mail, what every
shard applies next (world-state changes, presence, facts for every NPC), the outside input
journaled for a tick that never committed; it
re-sends what it published in that tick (what this start's run key opens:
sim.shard._instance) and the `say` lines the broker had not acknowledged when it
committed, and joins the run at the next one (Join), the others re-sending theirs.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from sim.protocol.admission import Peers
from sim.protocol.barrier import Barrier
from sim.protocol.outside import OutsideJournal
from sim.shard._clock import checkpoint
from sim.shard._context import ShardContext
from sim.shard._exchange import BarrierWait, Publisher, Status
from sim.shard._inputs import InputSource, LiveInputs, RunWideInputs, TickInputs
from sim.shard._instance import kept_messages
from sim.shard._intake import Intake
from sim.shard._moves import Movements
from sim.shard._pace import Pace
from sim.shard._registry import players
from sim.shard._startup import StartupPhase, create_agents, in_thread
from sim.shard._turns import Turns
from sim.shard._whereabouts import ChosenPlace
from sim.store import Pending, TickRecord
from sim.wire.events import WorldStateMessage
from sim.wire.inputs import OutsideInput
from sim.wire.trace import RosterEntry, RosterMessage

__all__ = ["Shard"]

log = logging.getLogger(__name__)

_PLACE_SLICE = 500  # places' logs appended between two yields
_RESEND_INTERVAL = 1.0  # seconds: at most one re-send per peer in this time, however many Joins it sends


class Shard:
    """One shard of a run: `start()`, then `step(tick)` or `run(until)`, then `go_offline()`."""

    def __init__(self, ctx: ShardContext, stop: asyncio.Event, source: InputSource | None = None) -> None:
        """`source`: where outside input and world-state changes come from; by default what
        arrives on the bus (`LiveInputs`), for a re-execution what the run took (sim.replay)."""
        self.ctx, self.stop = ctx, stop
        self.config, self.bus, self.store, self.stats, self.clock = ctx.config, ctx.bus, ctx.store, ctx.stats, ctx.clock
        layout = ctx.layout
        self.index, self.count = layout.index, layout.count
        last = self.store.last_tick if self.config.record.resume else None
        self.first = 0 if last is None else last + 1
        self.next_tick = self.first
        ticks = self.config.ticks if self.config.ticks is not None else ctx.scenario.scenario.ticks
        self.end = self.config.until_tick if self.config.until_tick is not None else self.first + ticks
        bus_config = self.bus.config  # barrier messages are believed whole when authenticated
        trusted = bus_config.run_key is not None or bus_config.broker.username is not None
        self.movements = Movements(ctx, self.bus)
        ctx.stats.moves = lambda: self.movements.moves
        self.barrier = Barrier(ctx.shard, [str(i) for i in range(self.count)], self._routes, tick=self.first,
                               trusted=trusted, session=secrets.token_hex(8))
        self.run_wide = RunWideInputs()
        # resumed: the first tick takes what the journal kept for it, what arrives now is the next one's
        journal = OutsideJournal(layout.local, layout.owned, ctx.plan.locations, npcs=layout.npc_location,
                                 shard_zero=self.index == 0,
                                 tick=self.first if last is None else self.first + 1)
        self.source: InputSource = source or LiveInputs(
            self.store, self.bus, self.run_wide, journal=journal,
            bounds=self.config.limits.bounds,
        )
        if isinstance(self.source, LiveInputs):
            self.source.join = self._join
        self.peers = Peers(self.barrier, answers_hello=self.index == 0, interval=_RESEND_INTERVAL)
        plan, bus, store, clock, stats = ctx.plan, self.bus, self.store, self.clock, self.stats
        stats.resending = self.peers.resends
        self.intake = Intake(plan, bus, store, clock, self.barrier, self.peers)
        self.status = Status(plan, bus, stats, self.first)
        self.inputs = TickInputs(plan, store, bus, ctx.outbox, clock, self.source, self.run_wide, self.intake.take,
                                 ctx.early)
        self.inputs.move = self.movements.advance
        self.turns = Turns(layout, bus, ctx.perception, ctx.early, ctx.agent, stop=stop,
                           workers=2 * self.config.inference.concurrency)  # the pool always has turns waiting
        self.pace = Pace(self.config.tick_ms, clock, bus, self.intake, self.source, shards=self.count, stop=stop)
        self.publisher = Publisher(bus, ctx.outbox, self.intake, self.source, self.run_wide, self._elsewhere,
                                   ctx.chosen)
        self.barrier_wait = BarrierWait(plan, bus, clock, ctx.metrics, self.intake, self.run_wide, self.status, stop)
        stats.taken, stats.waits = self.inputs.counts, self.barrier_wait.waits  # read, never copied
        self._committing: asyncio.Future[None] | None = None  # the last tick's commit, on its way to disk

    # --- starting and stopping ---------------------------------------------------------

    async def start(self) -> None:
        """Load or create the agents, listen to their topics, join the run's barrier, say "online"."""
        ctx, bus, stats = self.ctx, self.bus, self.stats
        bus.drop_batches_before(self.barrier.tick)
        await bus.listen_barrier()  # first: every batch is counted
        stats.agents = await create_agents(self.store, ctx.scenario, ctx.specs, stats.startup_progress)
        stats.startup_progress.enter(StartupPhase.SUBSCRIBING)
        specs = ctx.specs  # the roster of a large world is built off the loop
        npcs = await in_thread(lambda: tuple(RosterEntry(id=s.id, name=s.name, location=s.location) for s in specs),
                               "npcsim-roster")
        await bus.send("roster", RosterMessage(run=ctx.run_id, shard=ctx.shard, npcs=npcs))
        places = ctx.layout.places
        await bus.listen_places({place: len(places.get(place, ())) for place in ctx.plan.locations})
        await bus.listen_inboxes(ctx.layout.local)
        await self._restore()
        if self.index == 0:
            self.inputs.players = players(ctx.scenario, ctx.run_id, ctx.seed, bots=self.config.bots,
                                          bot_rate=self.config.bot_rate)
        bus.keep_outside(self.source.journal)
        for channel in ("player-input", "game-event", "game-fact", "game-goal"):
            await bus.listen(channel)
        if self.index == 0:  # every shard applies these at the tick shard 0's TickDone says
            await bus.listen("presence")
            await bus.listen("world-state")
            await bus.listen("game-move")
        await self.intake.rejoin()
        stats.first_tick, stats.last_tick, stats.tick = self.first, self.end - 1, self.first - 1
        if self.index == 0 and not self.config.record.resume and ctx.scenario.world:
            world = WorldStateMessage(state={w.key: w.value for w in ctx.scenario.world}, tick=self.first)
            await bus.send("world-state", world)
        await self.status.say()

    async def go_offline(self) -> None:
        """Say "offline" on the status topic (retained): the run ended here, in order."""
        await self.status.say("offline")

    async def _restore(self) -> None:
        """On resume: what the last committed tick left for the next one, from the store: the
        places' logs (and what was said there to this shard's NPCs), the inboxes' mail, what
        every shard applies next tick, and what the shard sent (to re-send, what this start's key
        opens; the others re-send theirs when it joins: docs/topics.md, "The tick barrier")."""
        last = self.first - 1
        if last < 0:
            await self.movements.begin(self.first, {}, {}, resumed=False)
            return
        resume, perception = self.store.resume, self.ctx.perception
        pending = await resume.pending()
        overrides = {npc: ChosenPlace(*placed) for npc, placed in pending.overrides.items()}
        await self.movements.begin(self.first, overrides, pending.arrivals, resumed=True)
        self.run_wide.moves = list(pending.moves)
        for tick, topic, payload in kept_messages(await resume.sent(), self.bus.config.run_key, self.config):
            self.barrier.keep(tick, topic, payload)
        for topic, payload in await resume.says():  # lines said that may never have left
            await self.bus.publish(topic, payload)
        perception.restore_summaries(await self.store.summaries())
        for place, rows in (await self.store.place_log()).items():
            for tick, events in rows:
                perception.append(place, events, mail=tick == last)
            await checkpoint()
        perception.stored()
        self.bus.mail.restore_mail(pending.mail)
        self.run_wide.world, self.run_wide.inputs = pending.world, pending.run_wide
        self.inputs.presence = dict(pending.presence)
        self.inputs.facts.run_wide = await resume.run_wide_facts()

    # --- the ticks -----------------------------------------------------------------------

    async def run(self, until: int) -> None:
        """Step every tick before `until`, paced by `tick_ms` (sooner when outside input waits
        for the next tick: sim.shard._pace), unless asked to stop.

        A tick's commit is written by SQLite (in its own thread) while the next tick's inputs
        and turns are taken; that tick publishes its TickDone only once the commit is on
        disk, so every shard still commits t-1 before anyone sends t's TickDone.
        """
        try:
            while self.next_tick < until and not self.stop.is_set():
                started = self.clock.now()
                if not await self._step(self.next_tick):
                    return
                if await self.pace.wait(started, self.next_tick):
                    self.stats.early_ticks += 1
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
        await self.inputs.take(tick)
        if not await self.turns.take(tick):
            log.warning("stopping during tick %d: it is not committed and runs again on --resume", tick)
            return False
        await self._committed()  # the last tick is on disk before this one's TickDone goes out
        await self.publisher.publish(tick)
        if not await self.barrier_wait.wait(tick):
            return False
        await self._perceive(tick)
        await self._commit(tick)
        self.next_tick = tick + 1
        self.stats.ticks_done += 1
        self.ctx.metrics.tick_done(self.clock.now() - started)
        return True

    def _join(self, player_input: OutsideInput) -> int | None:
        """The tick whose turns `player_input` joins (sim.shard._turns), or None: no turns under
        way, its NPC's turn of the tick began already, the tick's bounds are full, or the tick
        is a resumed shard's first (it takes exactly what it took before the kill)."""
        tick = self.turns.joinable(player_input.to)
        if tick is None or (self.config.record.resume and tick == self.first):
            return None
        assert isinstance(self.source, LiveInputs)
        numbered = self.source.admit(tick, player_input)
        if numbered is None:
            return None
        self.turns.join(player_input.to, lambda: self.inputs.take_joined(tick, numbered))
        self.stats.joined_turns += 1
        return tick

    def _routes(self, topic: str) -> bool:
        """Whether this shard takes `topic`'s batches in the tick under way: a place it hears
        (its own, or one where an NPC of its stands now), an inbox of its NPCs."""
        place = self.ctx.plan.place_of(topic)
        if place is None:
            return self.bus.is_routed(topic)
        return self.ctx.whereabouts.hears(place, self.index)

    def _elsewhere(self, topic: str) -> bool:
        """Whether another shard hears `topic` in the tick under way (then its batch goes
        through the broker, to this shard too when it hears it)."""
        place = self.ctx.plan.place_of(topic)
        if place is None:
            return not self.bus.is_routed(topic)
        return self.ctx.whereabouts.heard_beyond(place, self.index)

    async def _committed(self) -> None:
        """Until the last tick's commit is on disk (it raises what the writer met)."""
        committing, self._committing = self._committing, None
        if committing is not None:
            await committing

    async def _perceive(self, tick: int) -> None:
        """The tick's events at each of this shard's places into the place's log, once, and into
        the store as one row per place (with the tick from which the place's log is needed,
        when its window moved); what was said to an NPC there is its mail for the next tick."""
        perception, where, index = self.ctx.perception, self.ctx.whereabouts, self.index
        heard = [(place, events) for place, events in self.bus.mail.take_place_events(tick)
                 if where.hears(place, index)]  # the others' were for the shards that hear them
        for n, (place, events) in enumerate(heard, start=1):
            await self.store.add_place_events(place, tick, events, since=perception.perceive(place, events))
            await self.ctx.keep_notices(place, events)
            if n % _PLACE_SLICE == 0:
                await checkpoint()
        for place, summary in perception.take_summaries():
            await self.store.add_summary(place, summary)

    async def _commit(self, tick: int) -> None:
        """The tick, what it sent and what waits for the next one, in one transaction; status
        every 10 ticks."""
        self.bus.report_overflow(tick)
        where = self.ctx.whereabouts
        pending = Pending(mail=self.bus.mail.waiting_mail(tick), world=self.run_wide.world,
                          run_wide=self.run_wide.inputs, presence=dict(self.inputs.presence),
                          overrides={npc: (p.location, p.activity, p.tick) for npc, p in where.overrides.items()},
                          moves=list(self.run_wide.moves), arrivals=dict(self.movements.arrivals))
        record = TickRecord(sent=self.barrier.kept_by_tick(), says=self.bus.unsent_says(), pending=pending)
        self._committing = await self.store.commit_tick(tick, record)
        if self.config.record.retain_memories is not None:
            await self._committed()
            self.stats.memories_pruned += await self.store.prune_memories(self.config.record.retain_memories)
        if tick % 10 == 0:
            await self.status.say()
