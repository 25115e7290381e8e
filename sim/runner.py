"""The shard's public names as they were before sim.shard held them; callers keep working.

Inside sim, import from sim.shard.
"""

from sim.shard import (
    AGENT_KINDS,
    Agent,
    Clock,
    RunConfig,
    RunStats,
    Shard,
    ShardContext,
    SystemClock,
    hot_limit,
    parse_shard,
    run,
    shard_npcs,
)

__all__ = [
    "AGENT_KINDS",
    "Agent",
    "Clock",
    "RunConfig",
    "RunStats",
    "Shard",
    "ShardContext",
    "SystemClock",
    "hot_limit",
    "parse_shard",
    "run",
    "shard_npcs",
]
