"""How hard the budget cuts each category: counted per snapshot, summed, shipped, averaged.

The figures a user tunes `max_context_chars` and the shares with. For each flexible
category (dialogue, episodic, beliefs) and for the mandatory part (system prompt, input,
canonical facts, world state, scaffolding):

* `cut_fraction`: share of snapshots in which the category lost at least one item (to
  its budget or to its count cap; the mandatory part is never cut while the
  `always_include_*` flags are on);
* `kept_mean`, `dropped_mean`: mean items kept and dropped per snapshot;
* `duplicate_mean`: mean items left out per snapshot because a line of the dialogue says
  them already (memories only; not a cut);
* `used_fraction_mean`: mean of used / budget over the snapshots in which the category
  had a budget (> 0). With redistribution a category may use more than its share, so this
  can exceed 1. For the mandatory part the "budget" is the whole limit: it says how much
  of the limit is gone before any memory gets a character (> 1 when over budget).

Sizes are in characters. `selections` counts the snapshots each selection built
("recency", "scored"). A `TruncationTally` is a plain sum, so the sweep processes ship
deltas of it to the parent as they do their histograms.
"""

from __future__ import annotations

import msgspec

from sim.memory import SELECTIONS, CategoryReport, TruncationReport

__all__ = ["CATEGORIES", "CategoryTruncation", "TallyWire", "TruncationFigures", "TruncationTally"]

CATEGORIES = ("mandatory", "dialogue", "episodic", "beliefs")
# Per category: snapshots cut, items kept, items dropped, sum of used fractions, snapshots with a budget,
# items left out as duplicates.
_FIELDS = 6


class CategoryTruncation(msgspec.Struct, frozen=True, kw_only=True):
    cut_fraction: float
    kept_mean: float
    dropped_mean: float
    used_fraction_mean: float
    duplicate_mean: float


class TruncationFigures(msgspec.Struct, frozen=True, kw_only=True):
    """Per category, over `snapshots` snapshots; `over_budget_fraction`: mandatory part alone over the limit."""

    snapshots: int
    over_budget_fraction: float
    selections: dict[str, int]
    mandatory: CategoryTruncation
    dialogue: CategoryTruncation
    episodic: CategoryTruncation
    beliefs: CategoryTruncation


class TallyWire(msgspec.Struct, frozen=True, kw_only=True):
    """A tally as it crosses from a sweep process to the parent."""

    snapshots: int
    over_budget: int
    sums: list[float]
    selections: list[int]  # in the order of SELECTIONS


class TruncationTally:
    """Running sums of the truncation reports of many snapshots; merge with `merge`."""

    __slots__ = ("over_budget", "selections", "snapshots", "sums")

    def __init__(self) -> None:
        self.snapshots = 0
        self.over_budget = 0
        self.sums = [0.0] * (_FIELDS * len(CATEGORIES))
        self.selections = [0] * len(SELECTIONS)

    def _add(self, slot: int, cut: bool, kept: int, dropped: int, used: int, budget: int, duplicate: int = 0) -> None:
        base = slot * _FIELDS
        s = self.sums
        s[base] += cut
        s[base + 1] += kept
        s[base + 2] += dropped
        s[base + 5] += duplicate
        if budget > 0:
            s[base + 3] += used / budget
            s[base + 4] += 1

    def _category(self, slot: int, report: CategoryReport) -> None:
        self._add(slot, report.dropped > 0, report.kept, report.dropped, report.used, report.budget, report.duplicate)

    def record(self, report: TruncationReport) -> None:
        self.snapshots += 1
        self.over_budget += report.over_budget
        self.selections[SELECTIONS.index(report.selection)] += 1
        facts, world = report.canonical_facts, report.world_state
        self._add(0, facts.dropped + world.dropped > 0, facts.kept + world.kept, facts.dropped + world.dropped,
                  report.mandatory_chars, report.limit_chars)
        self._category(1, report.dialogue)
        self._category(2, report.episodic)
        self._category(3, report.beliefs)

    def merge(self, other: TruncationTally) -> None:
        self.snapshots += other.snapshots
        self.over_budget += other.over_budget
        self.sums = [a + b for a, b in zip(self.sums, other.sums, strict=True)]
        self.selections = [a + b for a, b in zip(self.selections, other.selections, strict=True)]

    def to_wire(self) -> TallyWire:
        return TallyWire(snapshots=self.snapshots, over_budget=self.over_budget, sums=list(self.sums),
                         selections=list(self.selections))

    @classmethod
    def from_wire(cls, wire: TallyWire) -> TruncationTally:
        tally = cls()
        tally.snapshots, tally.over_budget = wire.snapshots, wire.over_budget
        tally.sums = [float(x) for x in wire.sums]
        tally.selections = list(wire.selections)
        return tally

    def figures(self) -> TruncationFigures:
        n = max(self.snapshots, 1)

        def category(slot: int) -> CategoryTruncation:
            cut, kept, dropped, used, budgeted, duplicate = self.sums[slot * _FIELDS : (slot + 1) * _FIELDS]
            return CategoryTruncation(
                cut_fraction=round(cut / n, 4),
                kept_mean=round(kept / n, 3),
                dropped_mean=round(dropped / n, 3),
                used_fraction_mean=round(used / budgeted, 4) if budgeted else 0.0,
                duplicate_mean=round(duplicate / n, 3),
            )

        return TruncationFigures(
            snapshots=self.snapshots,
            over_budget_fraction=round(self.over_budget / n, 4),
            selections=dict(zip(SELECTIONS, self.selections, strict=True)),
            mandatory=category(0),
            dialogue=category(1),
            episodic=category(2),
            beliefs=category(3),
        )
