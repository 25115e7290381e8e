"""`open_shard`: one shard with its store, pool, bus and context, assembled in one place.

    plan = ShardPlan(config, scenario, run_id=run_id, seed=seed)
    async with open_shard(plan, db, stats=stats, stop=stop, connection=Connection(transport=t)) as shard:
        await shard.start()
        await shard.run(until=shard.end)

A process run (sim.shard._process), a replay (sim.replay) and the tests' in-memory shards
all open their shard here, so the order is written once: the store first, then `claim`
(what must hold of the store before anyone connects: that it belongs to this run; it gives
the run key), then the bus and the pool with that key, then the context and the shard.
The caller hands over the parts: the shard's plan (sim.shard._plan), where its store is,
how it reaches the broker (`Connection`), and what the caller puts in place of a live run's
defaults (`Seams`: a re-execution's recorded answers and inputs, the tokenizer a token
budget is counted with).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Literal, NamedTuple

from sim.audit import AuditRecord
from sim.bus import BusConfig, open_bus
from sim.inference import Backend, InferenceRequest, PoolConfig, Tokenizer, open_pool
from sim.metrics import MetricsSink, NullMetrics
from sim.mqtt import BrokerAddress, Transport
from sim.protocol.seal import RunKey
from sim.shard._clock import Clock
from sim.shard._context import MemoryConfigOf, ShardContext
from sim.shard._inputs import InputSource
from sim.shard._loop import Shard
from sim.shard._plan import ShardPlan
from sim.shard._run_config import hot_limit, pool_transport
from sim.shard._stats import RunStats
from sim.store import Store, open_store

__all__ = ["Claim", "Connection", "Seams", "open_shard"]

Claim = Callable[[Store], Awaitable[RunKey | None]]
"""What is done with the open store before the bus and the pool connect; gives the run key (or None)."""


class Connection(NamedTuple):
    """How a shard's bus and pool reach the broker: at `address` over MQTT `protocol`, or the
    bus through `transport` (an in-memory broker; the pool then serves in this process or its
    own worker process: `pool_transport`)."""

    address: BrokerAddress = BrokerAddress()
    protocol: Literal[5, 311] = 5
    transport: Transport | None = None


class Seams(NamedTuple):
    """What the caller puts in place of a live run's defaults: for a re-execution (sim.replay)
    the pool's `backend` and the `recorded` answers, the shard's outside `inputs` (live: what
    arrives on the bus) and each NPC's working-memory config at a tick (`memory_config_of`: a
    fork's); for a budget counted by a server (`tokenizer = "server"`), the `tokenizer` that
    fetches its counts (a run's opens its server's, a re-execution's reads the records')."""

    backend: Backend | None = None
    recorded: Callable[[InferenceRequest], AuditRecord | None] | None = None
    inputs: InputSource | None = None
    memory_config_of: MemoryConfigOf | None = None
    tokenizer: Tokenizer | None = None


_MQTT = Connection()  # the default broker's address, over MQTT 5
_LIVE = Seams()  # a live run: nothing put in place


@contextlib.asynccontextmanager
async def open_shard(
    plan: ShardPlan,
    db: Path,
    *,
    stats: RunStats,
    stop: asyncio.Event,
    connection: Connection = _MQTT,
    claim: Claim | None = None,
    metrics: MetricsSink | None = None,
    clock: Clock | None = None,
    seams: Seams = _LIVE,
) -> AsyncIterator[Shard]:
    """The shard of `plan`, its store at `db`, not started yet."""
    config, shard = plan.config, plan.shard
    async with open_store(db, hot_limit=hot_limit(plan.scenario.memory), keep_tail=False) as store:
        run_key = None if claim is None else await claim(store)
        bus_config = BusConfig(broker=connection.address, run=plan.run_id, shard=shard, protocol=connection.protocol,
                               bounds=config.limits.bounds, run_key=run_key)
        pool_config = PoolConfig.from_run(config.inference, transport=pool_transport(config, len(plan.layout.specs)),
                                          broker=connection.address, run_key=run_key, run_id=plan.run_id, shard=shard)
        async with (
            open_bus(bus_config, transport=connection.transport) as bus,
            open_pool(pool_config, backend=seams.backend, recorded=seams.recorded) as pool,
        ):
            stats.bus, stats.pool = bus.stats, pool.statistics
            metrics = metrics or NullMetrics()
            metrics.watch_run(stats)
            metrics.watch_pool(pool.statistics)
            metrics.watch_bus(bus.stats)
            ctx = ShardContext(plan, bus, pool, store, stats, metrics, clock=clock,
                               memory_config_of=seams.memory_config_of, tokenizer=seams.tokenizer)
            yield Shard(ctx, stop, source=seams.inputs)
