"""A Shard on the in-memory broker (tests/memory_broker.py), and a virtual clock that records its pacing.

    clock = PacingClock()
    broker = MemoryBroker(seed, clock)
    async with memory_shard(broker, scenario, config, db, stats, stop) as shard: ...
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from sim.bus import BusConfig, open_bus
from sim.inference import PoolConfig, open_pool
from sim.mqtt import BrokerAddress
from sim.scenario import Scenario
from sim.shard import RunConfig, RunStats, Shard, ShardContext, VirtualClock
from sim.store import open_store
from tests.memory_broker import MemoryBroker

__all__ = ["PacingClock", "memory_shard"]


class PacingClock(VirtualClock):
    """A virtual clock that also records every pacing sleep the shard asks for."""

    def __init__(self) -> None:
        super().__init__(autojump=0.005)
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float, stop: asyncio.Event) -> None:
        self.sleeps.append(seconds)
        await super().sleep(seconds, stop)


@contextlib.asynccontextmanager
async def memory_shard(
    broker: MemoryBroker, scenario: Scenario, config: RunConfig, db: Path, stats: RunStats, stop: asyncio.Event
) -> AsyncIterator[Shard]:
    """A Shard on the in-memory broker, with its store and an in-process pool."""
    index = config.shard.split("/")[0]
    bus_config = BusConfig(broker=BrokerAddress(), run="mem", shard=index)
    async with (
        open_store(db, keep_tail=False) as store,
        open_pool(PoolConfig()) as pool,
        open_bus(bus_config, transport=broker.transport()) as bus,
    ):
        stats.bus = bus.stats
        ctx = ShardContext(scenario, config, "mem", scenario.scenario.seed, bus, pool, store, stats,
                           clock=broker.clock)
        yield Shard(ctx, stop)
