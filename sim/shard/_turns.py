"""The tick's turns, taken by a bounded set of worker tasks, not one task per NPC.

The shard knows who takes a turn (the NPCs with mail, and those whose ambient dice fell);
`take_turns` steps them with at most `workers` at once, each worker taking the next turn
when it finished one and yielding to the event loop between turns (a scripted inference
may never suspend). A stop request ends the tick at once: no worker starts another turn,
the turns under way are cancelled, and the tick is not committed (it runs again on
--resume).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from sim.errors import single_error
from sim.shard._clock import checkpoint

__all__ = ["take_turns"]

T = TypeVar("T")


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
