"""What a phase counted from both parts, and the run's counts before a phase."""

from __future__ import annotations

import msgspec

from sim.loadtest._messages import SweepCounts
from sim.loadtest._proposals import GateTally
from sim.loadtest._snapshot import KEEP_VIOLATIONS
from sim.loadtest._stats import Histogram, LimitTally, ViolationRecord
from sim.loadtest._truncation import TruncationTally
from sim.memory import WorkingMemory

__all__ = ["Counts", "Totals"]


class Totals:
    """Everything counted so far, from both parts; interval histograms feed the timeline."""

    def __init__(self) -> None:
        self.sweep_snapshots = 0
        self.rt_snapshots = 0
        self.inferences = 0
        self.violations = 0
        self.over_budget = 0
        self.fallbacks = 0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.first_violations: list[ViolationRecord] = []
        self.build = Histogram()
        self.check = Histogram()
        self.infer = Histogram()
        self.round_trip = Histogram()
        self.truncation = TruncationTally()
        self.gates = GateTally()
        self.limits = LimitTally()
        self.interval_build = Histogram()
        self.interval_rt = Histogram()
        # The sweep's deltas as (seconds into the phase by the process's clock, snapshots, builds):
        # they arrive late when the event loop is busy, so the timeline is re-binned by these.
        self.sweep_marks: list[tuple[float, int, Histogram]] = []

    def add_violations(self, records: list[ViolationRecord], count: int) -> None:
        self.violations += count
        room = KEEP_VIOLATIONS - len(self.first_violations)
        if room > 0:
            self.first_violations.extend(records[:room])

    def add_tokens(self, prompt: int | None, completion: int | None, cached: int | None) -> None:
        if prompt is not None:
            self.prompt_tokens = (self.prompt_tokens or 0) + prompt
        if completion is not None:
            self.completion_tokens = (self.completion_tokens or 0) + completion
        if cached is not None:
            self.cached_tokens = (self.cached_tokens or 0) + cached

    @property
    def cache_share(self) -> float | None:
        """The share of the prompt tokens the server reused from its cache, where it said both."""
        if self.cached_tokens is None or not self.prompt_tokens:
            return None
        return self.cached_tokens / self.prompt_tokens

    def add_sweep(self, counts: SweepCounts) -> None:
        """Fold in one report of a sweep process."""
        self.sweep_snapshots += counts.snapshots
        self.over_budget += counts.over_budget
        self.add_violations(counts.found, counts.violations)
        build = Histogram.from_wire(counts.build)
        self.build.merge(build)
        self.interval_build.merge(build)
        self.sweep_marks.append((counts.active_s, counts.snapshots, build))
        self.check.merge(Histogram.from_wire(counts.check))
        self.truncation.merge(TruncationTally.from_wire(counts.truncation))

    def merge(self, other: Totals) -> None:
        """Add a finished phase's counts (interval histograms are the monitor's, not merged)."""
        self.sweep_snapshots += other.sweep_snapshots
        self.rt_snapshots += other.rt_snapshots
        self.inferences += other.inferences
        self.over_budget += other.over_budget
        self.fallbacks += other.fallbacks
        self.add_tokens(other.prompt_tokens, other.completion_tokens, other.cached_tokens)
        self.add_violations(other.first_violations, other.violations)
        for mine, theirs in ((self.build, other.build), (self.check, other.check), (self.infer, other.infer),
                             (self.round_trip, other.round_trip)):
            mine.merge(theirs)
        self.truncation.merge(other.truncation)
        self.gates.merge(other.gates)
        self.limits.merge(other.limits)

    def count_snapshot(self, wm: WorkingMemory) -> None:
        self.truncation.record(wm.report)
        if wm.report.over_budget:
            self.over_budget += 1


class Counts(msgspec.Struct, frozen=True, kw_only=True):
    """The run's counts before a phase: the live line's counts (and the metrics) never go back."""

    snapshots: int = 0
    inferences: int = 0
    violations: int = 0
    over_budget: int = 0
    fallbacks: int = 0

    def plus(self, t: Totals) -> Counts:
        return Counts(
            snapshots=self.snapshots + t.sweep_snapshots + t.rt_snapshots, inferences=self.inferences + t.inferences,
            violations=self.violations + t.violations, over_budget=self.over_budget + t.over_budget,
            fallbacks=self.fallbacks + t.fallbacks,
        )
