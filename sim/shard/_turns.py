"""The tick's second phase: its turns, taken by a bounded set of worker tasks, not one task per NPC.

`Turns.take(tick)` knows who takes a turn: the NPCs with mail from earlier ticks or with an
outside player's input taken by this tick (sim.shard._early), and those
whose ambient dice fell (rolled here for every local NPC, sim.shard._dice, in slices
between yields); no other NPC is touched. `take_turns` steps them with at most `workers`
at once, each worker taking the next turn when it finished one and yielding to the event
loop between turns (a scripted inference may never suspend). A stop request ends the
tick at once: no worker starts another turn, the turns under way are cancelled, and the
tick is not committed (it runs again on --resume).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from sim.bus import Bus
from sim.errors import single_error
from sim.scenario import NpcSpec
from sim.shard._clock import checkpoint
from sim.shard._early import EarlyMail
from sim.shard._layout import ShardLayout
from sim.shard._perception import Perception
from sim.shard._registry import Agent

__all__ = ["Turns", "take_turns"]

T = TypeVar("T")

_DICE_SLICE = 20_000  # NPCs' ambient dice rolled between two yields to the event loop


class Turns:
    """Phase 2 of a shard's tick; `stop` ends it between slices and turns."""

    def __init__(self, layout: ShardLayout, bus: Bus, perception: Perception, early: EarlyMail,
                 agent: Callable[[NpcSpec], Agent], *, workers: int, stop: asyncio.Event) -> None:
        """`agent(spec)`: the NPC's agent for one turn; `workers`: turns taken at once."""
        self._layout, self._bus, self._perception, self._agent = layout, bus, perception, agent
        self._early = early
        self._workers, self._stop = workers, stop

    async def take(self, tick: int) -> bool:
        """Every turn of `tick` taken; False when asked to stop first."""
        layout, dice = self._layout, self._layout.dice
        fallen: list[str] = []
        for start in range(0, len(dice), _DICE_SLICE):
            if self._stop.is_set():
                return False
            fallen += dice.roll(tick, start, start + _DICE_SLICE)
            await checkpoint()
        mailed = sorted({*self._bus.mail.mail_holders(tick), *self._perception.mail_holders(),
                         *self._early.holders()})
        ambient = set(fallen)
        woken = {agent: agent in ambient for agent in mailed}  # players' answers go to the pool first
        woken.update((agent, True) for agent in fallen)

        async def turn(item: tuple[str, bool]) -> None:
            await self._agent(layout.by_id[item[0]]).step(tick, item[1])

        return await take_turns(woken.items(), turn, workers=self._workers, stop=self._stop)


async def take_turns(turns: Iterable[T], step: Callable[[T], Awaitable[None]], *, workers: int,
                     stop: asyncio.Event) -> bool:
    """Step every turn, `workers` at a time; False when `stop` was set before all were taken."""
    pending = iter(turns)

    async def worker() -> None:
        for turn in pending:  # one iterator shared by the workers: each turn is taken once
            if stop.is_set():
                return
            await step(turn)
            await checkpoint()

    async def cancel_on_stop(running: list[asyncio.Task[None]]) -> None:
        await stop.wait()
        for task in running:
            task.cancel()

    try:
        async with asyncio.TaskGroup() as group:
            running = [group.create_task(worker(), name=f"turns-{n}") for n in range(max(1, workers))]
            watch = group.create_task(cancel_on_stop(running), name="turns-stop")
            await asyncio.wait(running)
            watch.cancel()
    except BaseExceptionGroup as group_error:
        raise single_error(group_error) from None
    return not any(task.cancelled() for task in running) and not stop.is_set()
