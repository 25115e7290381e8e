"""A Shard on the in-memory broker (tests/memory_broker.py), and a virtual clock that records its pacing.

    clock = PacingClock()
    broker = MemoryBroker(seed, clock)
    async with memory_shard(broker, scenario, config, db, stats, stop) as shard: ...

`run_shards` runs several such shards to their end, beside what a test does meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path

import msgspec

from sim.protocol.seal import RunKey
from sim.scenario import Scenario
from sim.shard import Connection, RunConfig, RunStats, Shard, ShardPlan, VirtualClock, open_shard
from sim.store import Store
from tests.memory_broker import MemoryBroker

__all__ = ["PacingClock", "memory_shard", "run_shards"]


class PacingClock(VirtualClock):
    """A virtual clock that also records every pacing sleep the shard asks for (what arrives may cut one short)."""

    def __init__(self) -> None:
        super().__init__(autojump=0.005)
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float, stop: asyncio.Event, wake: asyncio.Event | None = None) -> None:
        self.sleeps.append(seconds)
        await super().sleep(seconds, stop, wake)


@contextlib.asynccontextmanager
async def memory_shard(
    broker: MemoryBroker, scenario: Scenario, config: RunConfig, db: Path, stats: RunStats, stop: asyncio.Event,
    *, run_key: RunKey | None = None, seed: int | None = None,
) -> AsyncIterator[Shard]:
    """A Shard on the in-memory broker, with its store and an in-process pool; `run_key` seals the bus."""

    async def bound(_store: Store) -> RunKey | None:
        return run_key

    in_process = msgspec.structs.replace(
        config, inference=msgspec.structs.replace(config.inference, placement="in-process"))
    plan = ShardPlan(in_process, scenario, run_id=config.run_id or "mem",
                     seed=scenario.scenario.seed if seed is None else seed)
    async with open_shard(
        plan, db, stats=stats, stop=stop, connection=Connection(transport=broker.transport()), claim=bound,
        clock=broker.clock,
    ) as shard:
        yield shard


async def run_shards(broker: MemoryBroker, scenario: Scenario, configs: Sequence[RunConfig], dbs: Sequence[Path],
                     stats: Sequence[RunStats], during: Awaitable[None] | None = None) -> None:
    """Each config's shard (with its store and stats) run to its end on `broker`, `during`
    beside them; within two minutes."""

    async def one(i: int) -> None:
        async with memory_shard(broker, scenario, configs[i], dbs[i], stats[i], asyncio.Event()) as shard:
            await shard.start()
            await shard.run(until=shard.end)

    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        async with asyncio.timeout(120):
            await asyncio.gather(*(one(i) for i in range(len(configs))), *([during] if during is not None else []))
        server.cancel()
