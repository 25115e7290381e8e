"""What a run tells its watchers: `RunStats`, updated by the shard as it goes, and `RunStarted`.

The progress display and the summary read it (sim.cli.run), and the metrics read its
counters at scrape time (sim.metrics, `RunCounts`): each is counted here once. What the
pool and the bus count is theirs: it is read from them when asked (`pool`, `bus`), never
copied here. Its times
come from the shard's clock (`started`, `running_since`, `awaiting_since` are the clock's
monotonic seconds). It holds no login: what a watcher attaches with comes with
`RunStarted`, from the broker that made it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sim.broker import BrokerInfo
from sim.inference import PoolStatistics
from sim.protocol.router import BusStats
from sim.shard._startup import StartupProgress
from sim.wire.events import SayMessage

__all__ = ["RunStarted", "RunStats"]


@dataclass
class RunStats:
    """What the progress display and the summary read; updated by the shard."""

    run_id: str = ""
    shard: str = "0"
    broker: str = ""
    agents: int = 0
    first_tick: int = 0
    tick: int = -1  # the tick being stepped (or the last one stepped)
    ticks_done: int = 0  # ticks stepped to their end this run (a tick a stop cut short is not one)
    last_tick: int = 0
    inferences: int = 0
    fallbacks: int = 0
    over_budget: int = 0  # working memories whose mandatory content alone exceeded the limit
    prompt_tokens_evaluated: int = 0  # as the model server reported them (sim.audit.Usage), where it did
    prompt_tokens_cached: int = 0  # reused from the server's cache instead of evaluated
    prefix_reuse_pairs: int = 0  # inferences whose NPC had a previous prompt in this run (sim.memory.prefix_reuse)
    prefix_reuse_share: float = 0.0  # the sum of their prompts' shares that are a prefix of the previous prompt
    stable_cost_chars: int = 0  # kept characters that stable_prefix gave up, over every inference
    lines: int = 0
    player_inputs: int = 0
    stalls: int = 0
    barrier_seconds: float = 0.0  # time spent waiting at the barrier, after the first tick run
    barrier_ticks: int = 0
    awaiting: str = ""
    awaiting_since: float | None = None
    world_changes: int = 0  # world-state keys set anew: one publish of one key counts 1, not once per NPC
    memories_pruned: int = 0  # rows deleted by --retain-memories
    resends: int = 0  # re-sends of kept barrier messages made for peers' Joins
    resends_folded: int = 0  # peers' Joins folded into a later re-send by the per-peer rate limit
    started: float = 0.0  # the clock's now() when the run started (`run` sets it)
    running_since: float | None = None  # the clock's now() when start-up ended and the ticks began
    bus: BusStats | None = None
    stopped_by_signal: bool = False
    startup_progress: StartupProgress = field(default_factory=StartupProgress)
    dialogue: list[SayMessage] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)  # the gates' verdicts but "ok", by code (docs/npc-output.md)
    answered_by: dict[str, int] = field(default_factory=dict)  # calls answered, by model server (ServedBy.server)
    pool: Callable[[], PoolStatistics] | None = None  # the shard's pool's statistics (open_shard hands them)

    @property
    def server_limits(self) -> dict[str, int]:
        """Each model server's adaptive limit, as the pool keeps it now."""
        return {} if self.pool is None else self.pool().server_limits

    @property
    def inference_resends(self) -> int:
        """Inference requests sent to remote workers again (an outage, a dead worker)."""
        return 0 if self.pool is None else self.pool().resent


@dataclass(frozen=True)
class RunStarted:
    """What `run` hands its `on_ready` once the ticks begin: the run's stats and its broker
    (the shard's login, `run --view` follows the run with it; `viewer`, the watchers' login
    on a broker the run started)."""

    stats: RunStats
    broker: BrokerInfo
