"""`open_shard`: one shard with its store, pool, bus and context, assembled in one place.

    async with open_shard(config, scenario, run_id=run_id, seed=seed, db=db, stats=stats, stop=stop,
                          transport=broker.transport()) as shard:
        await shard.start()
        await shard.run(until=shard.end)

A process run (sim.shard._process), a replay (sim.replay) and the tests' in-memory shards
all open their shard here, so the order is written once: the store first, then `claim`
(what must hold of the store before anyone connects: that it belongs to this run; it gives
the run key), then the bus and the pool with that key, then the context and the shard.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Literal

from sim.audit import AuditRecord
from sim.bus import BusConfig, open_bus
from sim.inference import Backend, InferenceRequest, PoolConfig, Tokenizer, open_pool
from sim.metrics import MetricsSink, NullMetrics
from sim.mqtt import BrokerAddress, Transport
from sim.protocol.seal import RunKey
from sim.scenario import Scenario
from sim.shard._clock import Clock
from sim.shard._context import MemoryConfigOf, ShardContext
from sim.shard._inputs import InputSource
from sim.shard._layout import ShardLayout
from sim.shard._loop import Shard
from sim.shard._run_config import RunConfig, hot_limit, pool_transport
from sim.shard._stats import RunStats
from sim.store import Store, open_store

__all__ = ["Claim", "open_shard"]

Claim = Callable[[Store], Awaitable[RunKey | None]]
"""What is done with the open store before the bus and the pool connect; gives the run key (or None)."""


@contextlib.asynccontextmanager
async def open_shard(
    config: RunConfig,
    scenario: Scenario,
    *,
    run_id: str,
    seed: int,
    db: Path,
    stats: RunStats,
    stop: asyncio.Event,
    broker: BrokerAddress | None = None,
    protocol: Literal[5, 311] = 5,
    transport: Transport | None = None,
    claim: Claim | None = None,
    layout: ShardLayout | None = None,
    backend: Backend | None = None,
    recorded: Callable[[InferenceRequest], AuditRecord | None] | None = None,
    inputs: InputSource | None = None,
    memory_config_of: MemoryConfigOf | None = None,
    metrics: MetricsSink | None = None,
    clock: Clock | None = None,
    tokenizer: Tokenizer | None = None,
) -> AsyncIterator[Shard]:
    """Shard `config.shard` of `scenario`, its store at `db`, not started yet.

    The bus and the pool reach the broker at `broker` (MQTT `protocol`), or the bus goes
    through `transport` (an in-memory broker) and the pool serves in this process or its
    own worker process (`pool_transport`). A replay gives the pool a `backend` and the
    `recorded` answers, and the shard its outside `inputs` (by default what arrives on the bus).
    `tokenizer` is the server's its NPCs' token budgets are counted with (`tokenizer = "server"`).
    """
    layout = layout or ShardLayout(scenario, config.shard, seed)
    shard = str(layout.index)
    address = broker or BrokerAddress()
    async with open_store(db, hot_limit=hot_limit(scenario.memory), keep_tail=False) as store:
        run_key = None if claim is None else await claim(store)
        bus_config = BusConfig(broker=address, run=run_id, shard=shard, protocol=protocol, bounds=config.limits.bounds,
                               run_key=run_key)
        pool_config = PoolConfig.from_run(config.inference, transport=pool_transport(config, len(layout.specs)),
                                          broker=address, run_key=run_key, run_id=run_id, shard=shard)
        async with (
            open_bus(bus_config, transport=transport) as bus,
            open_pool(pool_config, backend=backend, recorded=recorded) as pool,
        ):
            stats.bus = bus.stats
            metrics = metrics or NullMetrics()
            metrics.watch_run(stats)
            metrics.watch_pool(pool.statistics)
            metrics.watch_bus(bus.stats)
            ctx = ShardContext(scenario, config, run_id, seed, bus, pool, store, stats, metrics, clock=clock,
                               layout=layout, memory_config_of=memory_config_of, tokenizer=tokenizer)
            yield Shard(ctx, stop, source=inputs)
