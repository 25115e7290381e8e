"""The tick's second phase: its turns, taken by a bounded set of worker tasks, not one task per NPC.

`Turns.take(tick)` knows who takes a turn: the NPCs with mail from earlier ticks or with an
outside player's input taken by this tick (sim.shard._early), and those
whose ambient dice fell (rolled here for every local NPC, sim.shard._dice, in slices
between yields); no other NPC is touched. `take_turns` steps them with at most `workers`
at once, each worker taking the next turn when it finished one and yielding to the event
loop between turns (a scripted inference may never suspend). A stop request ends the
tick at once: no worker starts another turn, the turns under way are cancelled, and the
tick is not committed (it runs again on --resume).

While the turns are under way, a player's input to an NPC whose turn of the tick is not
under way (it has none, or it still waits for a worker) may `join` them: the tick takes it
(journaled with that tick, as if it had arrived before its input phase) and the NPC
answers it in that turn (added to those under way when it had none) instead of a tick
later. It is the turn the NPC takes when the tick's inputs hold it from the start (a
re-execution, a resume): the NPC's turn had not begun, no other turn of the tick reads what
it says (lines are heard at the next tick), and the tick's batches are sorted.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from sim.bus import Bus
from sim.errors import single_error
from sim.scenario import NpcSpec
from sim.shard._clock import checkpoint
from sim.shard._early import EarlyMail
from sim.shard._layout import ShardLayout
from sim.shard._perception import Perception
from sim.shard._registry import Agent

__all__ = ["TurnQueue", "Turns", "take_turns"]

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
        self._under_way: TurnQueue[_Turn] | None = None
        self._tick = -1

    def joinable(self, npc: str) -> int | None:
        """The tick whose turns are under way, when `npc` has no turn of it under way or taken
        (none at all, or one still waiting for a worker); else None."""
        under_way = self._under_way
        if under_way is None or not under_way.open or under_way.started(npc):
            return None
        return self._tick

    def join(self, npc: str, first: Callable[[], Awaitable[None]]) -> None:
        """`npc`'s turn, after `first` (its input, taken): added to those under way, or, when it
        waits for a worker already, `first` put before it (`joinable`)."""
        if self._under_way is None or self.joinable(npc) is None:
            raise ValueError(f"{npc!r} cannot join the turns of tick {self._tick}")
        self._under_way.put(npc, lambda turn: (npc, turn[1] if turn else False, (*(turn[2] if turn else ()), first)))

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

        async def turn(item: _Turn) -> None:
            npc, ambient, inputs = item
            for taken in inputs:
                await taken()
            await self._agent(layout.by_id[npc]).step(tick, ambient)

        self._tick = tick
        self._under_way = TurnQueue({agent: (agent, ambient, ()) for agent, ambient in woken.items()})
        try:
            return await take_turns(self._under_way, turn, workers=self._workers, stop=self._stop)
        finally:
            self._under_way = None


_Turn = tuple[str, bool, tuple[Callable[[], Awaitable[None]], ...]]  # an NPC, ambient, inputs taken before it


class TurnQueue(Generic[T]):
    """A tick's turns by key, taken in order by the workers; while a worker is still at work
    (`open`), a turn may be added, or one still waiting changed (`put`): the last worker to
    find none left closes it."""

    def __init__(self, turns: dict[str, T]) -> None:
        self._turns = dict(turns)
        self._waiting = collections.deque(turns)
        self._started: set[str] = set()
        self.open = True
        self.working = 0

    def started(self, key: str) -> bool:
        """Whether `key`'s turn was taken by a worker."""
        return key in self._started

    def put(self, key: str, turn: Callable[[T | None], T]) -> None:
        """`key`'s turn made by `turn` from the one waiting (None: it had none, it is added)."""
        if key in self._started:
            raise ValueError(f"the turn of {key!r} was taken already")
        if key not in self._turns:
            self._waiting.append(key)
        self._turns[key] = turn(self._turns.get(key))

    def next(self) -> T | None:
        """The next turn, or None (and, for the last worker, closed)."""
        if self._waiting:
            key = self._waiting.popleft()
            self._started.add(key)
            return self._turns[key]
        self.working -= 1
        if self.working == 0:
            self.open = False
        return None


async def take_turns(turns: TurnQueue[T], step: Callable[[T], Awaitable[None]], *, workers: int,
                     stop: asyncio.Event) -> bool:
    """Step every turn, `workers` at a time, those added while they work too; False when
    `stop` was set before all were taken."""
    turns.working = max(1, workers)

    async def worker() -> None:
        while (turn := turns.next()) is not None:  # one queue shared by the workers: each turn is taken once
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
