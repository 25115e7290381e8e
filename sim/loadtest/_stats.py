"""Figures of a load test: mergeable latency histograms, counters, RSS, the live progress, the result.

Latencies go into log-scale buckets (3 % wide) rather than lists, so that a sweep process
can ship a compact delta to the parent every fraction of a second and millions of samples
cost a few hundred integers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

import msgspec
import psutil

from sim.loadtest._truncation import TruncationFigures

__all__ = [
    "KNEE_GAIN",
    "BudgetResult",
    "GateFigures",
    "Histogram",
    "HistogramWire",
    "LatencyFigures",
    "LimitFigures",
    "LimitTally",
    "LoadTestResult",
    "PeakRss",
    "Progress",
    "SweepPoint",
    "TimelinePoint",
    "ViolationRecord",
    "knee_concurrency",
]

_BASE = 1.03
_LOG_BASE = math.log(_BASE)


class HistogramWire(msgspec.Struct, frozen=True, kw_only=True):
    """A histogram as it crosses from a sweep process to the parent."""

    buckets: dict[int, int]
    count: int
    max_ns: int


class Histogram:
    """Latency samples in nanoseconds, bucketed on a log scale; merge with `merge`."""

    __slots__ = ("buckets", "count", "max_ns")

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.max_ns = 0

    def record(self, ns: int) -> None:
        self.buckets[int(math.log(ns + 1) / _LOG_BASE)] += 1
        self.count += 1
        if ns > self.max_ns:
            self.max_ns = ns

    def merge(self, other: Histogram) -> None:
        self.buckets.update(other.buckets)
        self.count += other.count
        self.max_ns = max(self.max_ns, other.max_ns)

    def percentile_ms(self, p: float) -> float:
        """The p-th percentile (0-100) in ms, to the bucket's geometric middle; 0 when empty."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(self.count * p / 100))
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return min(float(_BASE ** (bucket + 0.5)), self.max_ns) / 1e6
        return self.max_ns / 1e6

    def figures(self) -> LatencyFigures:
        return LatencyFigures(
            count=self.count,
            p50_ms=round(self.percentile_ms(50), 4),
            p95_ms=round(self.percentile_ms(95), 4),
            p99_ms=round(self.percentile_ms(99), 4),
            max_ms=round(self.max_ns / 1e6, 4),
        )

    def to_wire(self) -> HistogramWire:
        return HistogramWire(buckets=dict(self.buckets), count=self.count, max_ns=self.max_ns)

    @classmethod
    def from_wire(cls, wire: HistogramWire) -> Histogram:
        h = cls()
        h.buckets.update(wire.buckets)
        h.count, h.max_ns = wire.count, wire.max_ns
        return h


class PeakRss:
    """Resident memory of this process plus its children, sampled; keeps the peak."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self.peak_bytes = 0

    def sample(self) -> int:
        total = self._me.memory_info().rss
        for child in self._me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.NoSuchProcess:  # exited between listing and reading: nothing to add
                continue
        self.peak_bytes = max(self.peak_bytes, total)
        return total


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """What the live display shows, taken every interval; `phase` names the budget and concurrency."""

    elapsed_s: float
    planned_s: float | None
    requests: int | None
    snapshots: int
    snapshots_per_s: float
    inferences: int
    inferences_per_s: float
    violations: int
    over_budget: int
    fallbacks: int
    rss_mb: float
    phase: str = ""


class LatencyFigures(msgspec.Struct, frozen=True, kw_only=True):
    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


class LimitFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One model server's adaptive limit on requests in flight over a phase or the run: the
    value it settled on (the last one heard of) and the lowest and highest it took."""

    final: int
    min: int
    max: int


class LimitTally:
    """Each server's limit as the answers report it, kept as `LimitFigures`; merge with `merge`."""

    def __init__(self) -> None:
        self.figures: dict[str, LimitFigures] = {}

    def record(self, limits: Mapping[str, int]) -> None:
        for server, limit in limits.items():
            seen = self.figures.get(server)
            self.figures[server] = LimitFigures(final=limit, min=limit, max=limit) if seen is None else LimitFigures(
                final=limit, min=min(seen.min, limit), max=max(seen.max, limit))

    def merge(self, later: LimitTally) -> None:
        """Fold in what was counted after this: its final values are the final ones."""
        for server, theirs in later.figures.items():
            mine = self.figures.get(server, theirs)
            self.figures[server] = LimitFigures(final=theirs.final, min=min(mine.min, theirs.min),
                                                max=max(mine.max, theirs.max))


class ViolationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One broken invariant, with where it was found: "sweep" or "round_trip"."""

    agent_id: str
    invariant: str
    detail: str
    source: str
    player_input: str


class TimelinePoint(msgspec.Struct, frozen=True, kw_only=True):
    """One interval of the run: rates over it and the latency medians within it.

    `t_s` counts from the start of the first phase; `max_context_chars` and `concurrency`
    say which phase (budget, concurrency) the interval belongs to.
    """

    t_s: float
    snapshots_per_s: float
    inferences_per_s: float
    build_p50_ms: float
    round_trip_p50_ms: float
    rss_mb: float
    max_context_chars: int = 0
    concurrency: int = 0


class SweepPoint(msgspec.Struct, frozen=True, kw_only=True):
    """One concurrency of the model-server sweep, at one budget.

    `latency` is the inference alone (queue at the pool plus the backend); the tokens/s
    are None unless the backend reported them (the openai backend: the server's `usage`;
    the scripted backend counts the words of its reply as completion tokens);
    `prompt_cache_share` is the share of the prompt tokens the server reused from its cache,
    where it said so; `proposals_per_s` is None unless the agents propose (`--output structured`);
    `server_limits` is each model server's adaptive limit over the phase (an `openai` backend).
    """

    max_context_chars: int
    max_context_tokens: int | None
    concurrency: int
    duration_s: float
    inferences: int
    inferences_per_s: float
    latency: LatencyFigures
    fallbacks: int
    prompt_tokens_per_s: float | None
    completion_tokens_per_s: float | None
    prompt_cache_share: float | None = None
    proposals_per_s: float | None = None
    server_limits: dict[str, LimitFigures] = {}


class BudgetResult(msgspec.Struct, frozen=True, kw_only=True):
    """One budget of `--max-context-chars`/`--max-context-tokens`, over all its phases.

    `knee_concurrency`: the concurrency beyond which inferences/s rose by less than
    `KNEE_GAIN` (None with one concurrency, or when the highest level still gained that much).
    """

    max_context_chars: int
    max_context_tokens: int | None
    snapshots: int
    snapshots_per_s: float
    build_latency: LatencyFigures
    violations: int
    over_budget: int
    truncation: TruncationFigures
    knee_concurrency: int | None


KNEE_GAIN = 0.10


def knee_concurrency(points: list[tuple[int, float]]) -> int | None:
    """The lowest concurrency beyond which throughput never rises by KNEE_GAIN or more over its own.

    `points` are (concurrency, inferences/s) pairs in any order. Every higher level is
    compared, not only the next one, so that one noisy dip does not name a false knee.
    """
    ordered = sorted(points)
    for i, (c, rate) in enumerate(ordered[:-1]):
        if max(r for _, r in ordered[i + 1 :]) < rate * (1 + KNEE_GAIN):
            return c
    return None


class GateFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What the gates made of the round trip's structured replies (`--output structured`).

    `proposals` counts the beliefs, memories and intents of every attempt; `verdicts` every
    part's verdict by code, the lines' included ("ok" for an accepted one); `violations` the
    rules an accepted part broke, found by the independent check (`sim.checkers.proposals`).
    """

    proposals: int
    proposals_per_s: float
    verdicts: dict[str, int]
    violations: int
    first_violations: list[ViolationRecord]


class LoadTestResult(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the final table shows; `--json` writes exactly this.

    `snapshots_per_s` is the build-and-check throughput of the sweep processes alone
    (`processes` of them, measured while the round trip ran alongside; without a sweep,
    the round trip's own rate); `all_snapshots_per_s` counts every snapshot built and
    checked by both parts over the run's wall time. `inferences_per_s` is the round trip's
    rate (build, check and inference in this process, `concurrency` requests in flight).

    With several budgets or concurrencies the run has one phase per (budget, concurrency)
    pair; the top-level figures are the whole run's, `max_context_chars`,
    `max_context_tokens` and `concurrency` are the first of their lists, `budgets` has one
    entry per budget and `sweep` one per phase with round trips. `server_limits` is each
    model server's adaptive limit over the whole run (an `openai` backend; empty for the others).
    """

    agents: int
    seed: int
    duration_s: float
    processes: int
    concurrency: int
    backend: str
    latency_ms: float
    broker: str | None
    max_context_chars: int
    max_context_tokens: int | None
    snapshots: int
    sweep_snapshots: int
    snapshots_per_s: float
    all_snapshots_per_s: float
    inferences: int
    inferences_per_s: float
    build_latency: LatencyFigures
    check_latency: LatencyFigures
    infer_latency: LatencyFigures
    round_trip_latency: LatencyFigures
    violations: int
    first_violations: list[ViolationRecord]
    over_budget: int
    fallbacks: int
    peak_rss_mb: float
    timeline: list[TimelinePoint]
    truncation: TruncationFigures
    budgets: list[BudgetResult]
    sweep: list[SweepPoint]
    output: str = "line"
    gates: GateFigures | None = None
    server_limits: dict[str, LimitFigures] = {}
