"""The wait between two ticks: `tick_ms` is the pace of a quiet world, not a wait imposed on input.

With nothing from outside, a tick begins `tick_ms` after the one before began. When outside
input waits for the next tick (a player's words, the game system's event or a fact for one
NPC, stamped with that tick as it arrived: sim.protocol.outside), the next tick begins as
soon as the current one ended, and the addressed NPC answers in it (sim.shard._early). What
every shard applies (world state, presence, a fact for every NPC) travels in the next
tick's TickDone and takes effect at the tick after it: it keeps the pace. On several
shards the one holding the input says so (`Start`, on the barrier's topic) and every shard
begins that tick too, so they step together.

A flood of input cannot make the ticks spin: each early tick is still one whole tick (its
turns, the barrier, its commit), and it begins no sooner than `EARLIEST` of `tick_ms` after
the tick before began, so a world gets at most ten ticks per `tick_ms` however much comes in.
What a tick takes does not depend on when it begins, only on the stamps, so an early tick
changes no audit: a re-execution, a resume and every shard layout take the same input at
the same tick.
"""

from __future__ import annotations

import asyncio

from sim.bus import Bus
from sim.shard._clock import Clock
from sim.shard._inputs import InputSource
from sim.shard._intake import Intake

__all__ = ["EARLIEST", "Pace"]

EARLIEST = 0.1
"""The share of `tick_ms` that passes, at least, between the beginnings of two ticks."""


class Pace:
    """`wait(began, tick)`: until `tick` may begin, `tick_ms` after the tick before `began`, or sooner."""

    def __init__(self, tick_ms: int, clock: Clock, bus: Bus, intake: Intake, source: InputSource, *, shards: int,
                 stop: asyncio.Event) -> None:
        self._seconds = tick_ms / 1000
        self._clock, self._bus, self._intake, self._source = clock, bus, intake, source
        self._shards, self._stop = shards, stop

    async def wait(self, began: float, tick: int) -> bool:
        """Until `tick` may begin; True when it begins before the pace (input waits for it)."""
        if not self._seconds:
            return False  # no pace: every tick begins as soon as the one before ended
        clock, barrier = self._clock, self._intake.barrier
        quiet, earliest = began + self._seconds, began + self._seconds * EARLIEST
        while not self._stop.is_set():
            now = clock.now()
            if now >= quiet:
                return False
            here = self._source.waiting(tick)
            if here or barrier.starts(tick):
                if now >= earliest:
                    if here and self._shards > 1 and not barrier.starts(tick):
                        await self._bus.publish_barrier(barrier.start(tick))
                    return True
                until = earliest
            else:
                until = quiet
            await clock.sleep(until - now, self._stop, wake=self._bus.arrived)
            await self._intake.take()  # a peer's Start, or what the bus queued meanwhile
        return False
