"""What a run tells its watchers: `RunStats`, read from the parts that count, and `RunStarted`.

The progress display and the summary read it (sim.cli.run), and the metrics read its
counters at scrape time (sim.metrics, `RunCounts`). Each number has one owner that counts
it: the recorder (`RecordCounts`), the input phase (`InputCounts`), the barrier wait
(`BarrierWaits`), the peers' re-sends, the pool and the bus; the shard hands `RunStats`
those parts as it opens, and `RunStats` reads them when asked: nothing is copied per tick
or per inference. What is the run's own (its identity, its ticks, its start-up) is kept
here. Its times come from the shard's clock (`started`, `running_since`, `awaiting_since`
are the clock's monotonic seconds). It holds no login: what a watcher attaches with comes
with `RunStarted`, from the broker that made it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sim.broker import BrokerInfo
from sim.inference import PoolStatistics
from sim.protocol.admission import Resends
from sim.protocol.router import BusStats
from sim.shard._startup import StartupProgress
from sim.wire.events import SayMessage

__all__ = ["BarrierWaits", "InputCounts", "RecordCounts", "RunStarted", "RunStats"]


@dataclass
class RecordCounts:
    """What the recorder counts of the lines said (sim.shard._recorder)."""

    inferences: int = 0
    fallbacks: int = 0
    over_budget: int = 0  # working memories whose mandatory content alone exceeded the limit
    prompt_tokens_evaluated: int = 0  # as the model server reported them (sim.audit.Usage), where it did
    prompt_tokens_cached: int = 0  # reused from the server's cache instead of evaluated
    prefix_reuse_pairs: int = 0  # inferences whose NPC had a previous prompt in this run (sim.shard._prefix)
    prefix_reuse_share: float = 0.0  # the sum of their prompts' shares that are a prefix of the previous prompt
    stable_cost_chars: int = 0  # kept characters that stable_prefix gave up, over every inference
    lines: int = 0
    dialogue: list[SayMessage] = field(default_factory=list)  # the lines said, when kept
    verdicts: dict[str, int] = field(default_factory=dict)  # the gates' verdicts but "ok", by code (docs/npc-output.md)
    answered_by: dict[str, int] = field(default_factory=dict)  # calls answered, by model server (ServedBy.server)


@dataclass
class InputCounts:
    """What the tick's input phase counts (sim.shard._inputs)."""

    player_inputs: int = 0
    world_changes: int = 0


@dataclass
class BarrierWaits:
    """What the barrier wait counts (sim.shard._exchange): its stalls, the time waited after
    the first tick and the ticks waited, whom it waits for now and since when."""

    stalls: int = 0
    seconds: float = 0.0
    ticks: int = 0
    awaiting: str = ""
    awaiting_since: float | None = None


@dataclass
class RunStats:
    """What the progress display and the summary read: the run's own figures, and its parts' read."""

    run_id: str = ""
    shard: str = "0"
    broker: str = ""
    agents: int = 0
    first_tick: int = 0
    tick: int = -1  # the tick being stepped (or the last one stepped)
    ticks_done: int = 0  # ticks stepped to their end this run (a tick a stop cut short is not one)
    early_ticks: int = 0  # ticks begun before the pace (`tick_ms`): outside input waited for them
    joined_turns: int = 0  # players' inputs answered in the tick under way, in a turn joining its turns
    moves: Callable[[], int] | None = None  # this shard's NPCs' moves so far (the shard hands its count)
    last_tick: int = 0
    memories_pruned: int = 0  # rows deleted by --retain-memories
    started: float = 0.0  # the clock's now() when the run started (`run` sets it)
    running_since: float | None = None  # the clock's now() when start-up ended and the ticks began
    bus: BusStats | None = None
    stopped_by_signal: bool = False
    startup_progress: StartupProgress = field(default_factory=StartupProgress)
    pool: Callable[[], PoolStatistics] | None = None  # the shard's pool's statistics (open_shard hands them)
    resending: Resends | None = None  # the re-sends the shard owes its peers (the shard hands them)
    waits: BarrierWaits = field(default_factory=BarrierWaits)  # the barrier wait's (the shard hands them)
    taken: InputCounts = field(default_factory=InputCounts)  # the input phase's (the shard hands them)
    recorded: RecordCounts = field(default_factory=RecordCounts)  # the recorder's (the shard hands them)

    @property
    def inferences(self) -> int:
        return self.recorded.inferences

    @property
    def npc_moves(self) -> int:
        """This shard's NPCs' moves (a routine's, a `go_to`, the game's): none costs an inference."""
        return 0 if self.moves is None else self.moves()

    @property
    def inferences_per_npc_tick(self) -> float:
        """What a tick of one NPC costs in model calls, over the ticks stepped: a run's cost with a real model."""
        return self.inferences / max(self.agents * self.ticks_done, 1)

    @property
    def fallbacks(self) -> int:
        return self.recorded.fallbacks

    @property
    def over_budget(self) -> int:
        return self.recorded.over_budget

    @property
    def prompt_tokens_evaluated(self) -> int:
        return self.recorded.prompt_tokens_evaluated

    @property
    def prompt_tokens_cached(self) -> int:
        return self.recorded.prompt_tokens_cached

    @property
    def prefix_reuse_pairs(self) -> int:
        return self.recorded.prefix_reuse_pairs

    @property
    def prefix_reuse_share(self) -> float:
        return self.recorded.prefix_reuse_share

    @property
    def stable_cost_chars(self) -> int:
        return self.recorded.stable_cost_chars

    @property
    def lines(self) -> int:
        return self.recorded.lines

    @property
    def dialogue(self) -> list[SayMessage]:
        return self.recorded.dialogue

    @property
    def verdicts(self) -> dict[str, int]:
        return self.recorded.verdicts

    @property
    def answered_by(self) -> dict[str, int]:
        return self.recorded.answered_by

    @property
    def player_inputs(self) -> int:
        return self.taken.player_inputs

    @property
    def world_changes(self) -> int:
        """World-state keys set anew: one publish of one key counts 1, not once per NPC."""
        return self.taken.world_changes

    @property
    def stalls(self) -> int:
        return self.waits.stalls

    @property
    def barrier_seconds(self) -> float:
        """Time spent waiting at the barrier, after the first tick run."""
        return self.waits.seconds

    @property
    def barrier_ticks(self) -> int:
        return self.waits.ticks

    @property
    def awaiting(self) -> str:
        return self.waits.awaiting

    @property
    def awaiting_since(self) -> float | None:
        return self.waits.awaiting_since

    @property
    def resends(self) -> int:
        """Re-sends of kept barrier messages made for peers' Joins."""
        return 0 if self.resending is None else self.resending.resends

    @property
    def resends_folded(self) -> int:
        """Peers' Joins folded into a later re-send by the per-peer rate limit."""
        return 0 if self.resending is None else self.resending.folded

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
    """What `run` hands its `on_ready` once the ticks begin: the run's stats, its broker
    (the shard's login, `run --view` follows the run with it; `viewer`, the watchers' login
    on a broker the run started) and its store (None: a temporary file, gone with the run)."""

    stats: RunStats
    broker: BrokerInfo
    store: Path | None = None
