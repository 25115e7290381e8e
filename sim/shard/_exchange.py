"""The tick's exchange with the other shards: publish (phase 3) and the barrier (phase 4).

`Publisher.publish(tick)`: the tick's outbox, one batch per topic. A batch for this shard's
own places or NPCs is delivered here from the objects (no broker, no echo to wait for);
the others are sealed and published; then the shard's TickDone, listing those (shard 0's
with what every shard applies next tick: the world-state changes, players' presence and
facts for every NPC it took), and everything published is kept for re-sending.

`BarrierWait.wait(tick)`: until every shard finished the tick and every batch of it a peer
published for this shard arrived (none to wait for on one shard). Meanwhile it acts on
what the bus hands over and serves the re-sends peers' Joins asked for (at most one per
peer per second, sim.protocol.admission); a stall is logged and shown on the status
topic, never skipped; a stop while it holds ends the tick uncommitted.

`Status` says the shard's state on its status topic (retained).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sim.bus import Bus
from sim.errors import ConfigError
from sim.metrics import MetricsSink
from sim.protocol.barrier import summarise
from sim.protocol.outbox import Outbox
from sim.shard._clock import Clock, checkpoint
from sim.shard._inputs import InputSource, RunWideInputs
from sim.shard._intake import Intake
from sim.shard._plan import ShardPlan
from sim.shard._stats import BarrierWaits, RunStats
from sim.wire.events import StatusMessage

__all__ = ["BarrierWait", "Publisher", "Status"]

log = logging.getLogger(__name__)

_BARRIER_POLL = 0.5  # seconds between looks at a held barrier (status, stall warning)
_DELIVERY_SLICE = 5_000  # events delivered locally between two yields

class Status:
    """The shard's state on its status topic: online (and whom it waits for), offline."""

    def __init__(self, plan: ShardPlan, bus: Bus, stats: RunStats, first: int) -> None:
        self._plan, self._bus, self._stats, self._first = plan, bus, stats, first

    async def say(self, state: str = "online", *, awaiting: str | None = None, since: float | None = None) -> None:
        plan, tick = self._plan, self._stats.tick if self._stats.tick >= 0 else self._first
        await self._bus.send(
            "status",
            StatusMessage(run=plan.run_id, shard=plan.shard, state=state, tick=tick, awaiting=awaiting, since=since)
        )


class Publisher:
    """Phase 3 of a shard's tick."""

    def __init__(self, bus: Bus, outbox: Outbox, intake: Intake, source: InputSource, run_wide: RunWideInputs,
                 elsewhere: Callable[[str], bool], chosen: list[tuple[str, str]]) -> None:
        """`elsewhere(topic)`: another shard takes the topic's batches this tick; `chosen`: the
        moves the shard's NPCs chose in the tick (`go_to`, the context's list), for its TickDone."""
        self._bus, self._outbox, self._intake, self._source, self._run_wide = bus, outbox, intake, source, run_wide
        self._elsewhere, self._chosen = elsewhere, chosen

    async def publish(self, tick: int) -> None:
        bus, barrier, outbox = self._bus, self._intake.barrier, self._outbox
        delivered = 0
        for batch in outbox.take():
            if not self._elsewhere(batch.topic):
                bus.deliver(batch.topic, batch.events)
                delivered += len(batch.events)
                if delivered >= _DELIVERY_SLICE:
                    delivered = 0
                    await checkpoint()
                continue
            sealed = outbox.seal(tick, batch)
            await bus.publish(sealed.topic, sealed.payload)
            barrier.keep(tick, sealed.topic, sealed.payload, events=sealed.events)
        self._source.close_done(tick)  # shard 0: what every shard applies that arrived until now
        await self._intake.take()
        announced = self._run_wide.announce(tick)
        moves = tuple(sorted(set(self._chosen)))
        self._chosen.clear()
        topic, payload = await bus.publish_barrier(barrier.finish(tick, announced.world, announced.inputs, moves))
        barrier.keep(tick, topic, payload)


class BarrierWait:
    """Phase 4 of a shard's tick. The intake's barrier starts at the shard's first tick, whose
    wait is not counted (it also waits for the other shards to start)."""

    def __init__(self, plan: ShardPlan, bus: Bus, clock: Clock, metrics: MetricsSink, intake: Intake,
                 run_wide: RunWideInputs, status: Status, stop: asyncio.Event) -> None:
        self._plan, self._bus, self._clock, self._metrics = plan, bus, clock, metrics
        self._intake, self._run_wide, self._status, self._stop = intake, run_wide, status, stop
        self._first = intake.barrier.tick
        self.waits = BarrierWaits()

    async def wait(self, tick: int) -> bool:
        """Until the barrier for `tick` passes; False when asked to stop while it holds."""
        barrier, clock, waits, metrics = self._intake.barrier, self._clock, self.waits, self._metrics
        started, since = clock.now(), clock.wall()
        look = started + _BARRIER_POLL
        announced = ""
        warned = False
        while True:
            await self._intake.take()
            await self._serve_resends()
            if barrier.conflict is not None:
                raise ConfigError(f"--shard {self._plan.config.shard}: {barrier.conflict}")
            if barrier.passed(tick):
                zero = barrier.announced(tick)  # shard 0's TickDone: what every shard applies next tick
                if zero is not None:
                    self._run_wide.world, self._run_wide.inputs = zero.world, zero.inputs
                self._run_wide.moves = barrier.moves(tick)
                break
            now = clock.now()
            if now >= look:
                if self._stop.is_set():
                    held = summarise(barrier.awaited(tick))
                    log.warning("stopping while tick %d waits for %s: it runs again on --resume", tick, held)
                    return False
                look = now + _BARRIER_POLL
                awaited = barrier.awaited(tick)
                awaiting = summarise(awaited)
                metrics.awaiting(len(awaited))
                if awaiting != announced:
                    announced = awaiting
                    waits.awaiting, waits.awaiting_since = awaiting, started
                    await self._status.say(awaiting=awaiting, since=since)
                waited = now - started
                if waited >= self._plan.config.limits.echo_timeout and not warned:
                    warned = True
                    waits.stalls += 1
                    log.warning("tick %d: waiting for %s for %.1f s; the run holds until then", tick, awaiting, waited)
            await clock.wait(self._bus.arrived, look - now)
        barrier.advance(tick)
        self._bus.drop_batches_before(barrier.tick)
        metrics.awaiting(0)
        if tick > self._first:
            waits.seconds += clock.now() - started
            waits.ticks += 1
        if announced:
            waits.awaiting, waits.awaiting_since = "", None
            await self._status.say()
        return True

    async def _serve_resends(self) -> None:
        """Re-send what peers' Joins asked for, when it is due; say once per interval how many
        were folded."""
        peers = self._intake.peers
        now = self._clock.now()
        since = peers.resend_from(now)
        if since is not None:
            for topic, payload in self._intake.barrier.kept(since):
                await self._bus.publish(topic, payload)
        folded = peers.folded(now)
        if folded:
            detail = ", ".join(f"{n} of shard {peer}" for peer, n in sorted(folded.items()))
            log.warning("Join requests folded into later re-sends (one per peer per %g s): %s",
                        peers.resends.interval, detail)
