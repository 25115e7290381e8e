"""What-if with recorded replies: each record's snapshot rebuilt under another config.

The world unfolds exactly as recorded, so the state snapshot an audit record holds is
what that model call would have been given under any budget; `build_working_memory` of
it with the variant's config is what the call would have seen, and no model, shard or
broker is needed. Kept items are always a category's newest candidates
(`sim.memory.distinct`: no memory that a candidate line says), so what a variant lost or
gained against the original is the run of items between the two kept counts (the
original's are the record's report) when both have the same candidates, and otherwise
the difference of the two kept runs (a variant with another `max_dialogue_lines`).
`duplicate` counts the memories a variant left out because a line of the dialogue says them.

`what_if(records, variants, examples)` folds a run of records into one `Tally` per
variant; tallies of consecutive runs `add` up, so the pass spreads over processes
(`sim.replay.map_spans`) and reports what one process would. `write_plot` draws the
tallies as the load test draws its own (`--plot`, extra `plot`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from sim.audit import AuditRecord, prompt_sha256
from sim.memory import CategoryReport, NpcState, TruncationReport, WorkingMemoryConfig, build_working_memory, distinct
from sim.replay._overrides import Variant

__all__ = ["CATEGORIES", "Change", "Tally", "what_if", "write_plot"]

CATEGORIES = ("canonical_facts", "world_state", "beliefs", "episodic", "dialogue")
"""The prompt's categories, in its order."""


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """One item a variant's working memory lost or gained against the recorded one."""

    record: str
    agent: str
    tick: int
    category: str
    change: str  # "lost" or "gained"
    item: dict[str, Any]

    def order(self) -> tuple[int, str, str, int, str]:
        return (self.tick, self.agent, self.record, CATEGORIES.index(self.category), self.change)


def _zeros() -> dict[str, int]:
    return dict.fromkeys(CATEGORIES, 0)


class Tally(msgspec.Struct, kw_only=True):
    """What one variant did over a run of records, against the recorded working memories.

    `npcs` maps an NPC to its [lost, gained] item counts (NPCs with a change only);
    `examples` are the first changes in record order, at most the asked number per
    category and kind of change.
    """

    label: str
    inferences: int = 0
    prompts_changed: int = 0
    lost: dict[str, int] = msgspec.field(default_factory=_zeros)
    gained: dict[str, int] = msgspec.field(default_factory=_zeros)
    npcs: dict[str, list[int]] = {}
    chars: int = 0
    chars_max: int = 0
    recorded_chars: int = 0
    over_budget: int = 0
    recorded_over_budget: int = 0
    duplicate: int = 0  # memories left out because a line of the dialogue says them
    recorded_duplicate: int = 0
    facts: int = 0  # canonical facts in the snapshots
    facts_present: int = 0
    world: int = 0
    world_present: int = 0
    examples: list[Change] = []

    def add(self, later: Tally, examples: int) -> None:
        """Fold in the tally of later records (of the same variant)."""
        self.inferences += later.inferences
        self.prompts_changed += later.prompts_changed
        for category in CATEGORIES:
            self.lost[category] += later.lost[category]
            self.gained[category] += later.gained[category]
        for agent, (lost, gained) in later.npcs.items():
            counts = self.npcs.setdefault(agent, [0, 0])
            counts[0] += lost
            counts[1] += gained
        self.chars += later.chars
        self.chars_max = max(self.chars_max, later.chars_max)
        self.recorded_chars += later.recorded_chars
        self.over_budget += later.over_budget
        self.recorded_over_budget += later.recorded_over_budget
        self.facts += later.facts
        self.facts_present += later.facts_present
        self.world += later.world
        self.world_present += later.world_present
        self.duplicate += later.duplicate
        self.recorded_duplicate += later.recorded_duplicate
        merged = sorted([*self.examples, *later.examples], key=Change.order)
        self.examples = _first(merged, examples)


def _first(changes: Iterable[Change], limit: int) -> list[Change]:
    """The first `limit` changes of each (category, kind), in the order given."""
    taken: dict[tuple[str, str], int] = {}
    kept = []
    for change in changes:
        key = (change.category, change.change)
        if taken.get(key, 0) < limit:
            taken[key] = taken.get(key, 0) + 1
            kept.append(change)
    return kept


def _kept(report: TruncationReport, category: str) -> int:
    section: CategoryReport = getattr(report, category)
    return section.kept


class _Configs:
    """Each variant's config for a recorded config and NPC, built (and validated) once."""

    def __init__(self, variants: Sequence[Variant]) -> None:
        self._variants = variants
        self._built: dict[tuple[int, WorkingMemoryConfig, str | None], WorkingMemoryConfig] = {}

    def get(self, n: int, recorded: WorkingMemoryConfig, agent: str) -> WorkingMemoryConfig:
        variant = self._variants[n]
        key = (n, recorded, agent if agent in variant.npcs else None)
        config = self._built.get(key)
        if config is None:
            config = self._built[key] = variant.config(recorded, agent)
        return config


def what_if(records: Iterable[AuditRecord], variants: Sequence[Variant], examples: int = 0) -> list[Tally]:
    """One tally per variant over `records`, in order."""
    tallies = [Tally(label=v.label) for v in variants]
    taken: list[dict[tuple[str, str], int]] = [{} for _ in variants]  # examples so far, by (category, change)
    configs = _Configs(variants)
    for record in records:
        state, report = record.state, record.report
        facts, world = len(state.canonical_facts), len(state.world_state)
        for n, tally in enumerate(tallies):
            config = configs.get(n, record.config, record.agent_id)
            memory = build_working_memory(state, record.player_input, config)
            tally.inferences += 1
            changed = memory.prompt != record.prompt if record.prompt is not None else (
                prompt_sha256(memory) != record.prompt_sha256)
            tally.prompts_changed += changed
            new = memory.report
            tally.chars += new.prompt_chars
            tally.chars_max = max(tally.chars_max, new.prompt_chars)
            tally.recorded_chars += report.prompt_chars
            tally.over_budget += new.over_budget
            tally.recorded_over_budget += report.over_budget
            tally.duplicate += new.episodic.duplicate
            tally.recorded_duplicate += report.episodic.duplicate
            tally.facts += facts
            tally.facts_present += len(memory.canonical_facts)
            tally.world += world
            tally.world_present += len(memory.world_state)
            if changed:
                _count_changes(tally, record, (new, config), examples, taken[n])
    return tallies


def _newest(state: NpcState, category: str, k: int) -> tuple[Any, ...]:
    items: tuple[Any, ...] = getattr(state, category)
    return items[len(items) - k :] if k else ()


def _missing(ours: tuple[Any, ...], theirs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The items of `ours` that `theirs` does not hold (as many times as it holds them), in order."""
    left = collections.Counter(theirs)
    out = []
    for item in ours:
        if left[item]:
            left[item] -= 1
        else:
            out.append(item)
    return tuple(out)


def _count_changes(
    tally: Tally, record: AuditRecord, variant: tuple[TruncationReport, WorkingMemoryConfig], examples: int,
    taken: dict[tuple[str, str], int],
) -> None:
    new, config = variant
    was = distinct(record.state, record.config.max_dialogue_lines).state
    now = distinct(record.state, config.max_dialogue_lines).state
    lost_here = gained_here = 0
    for category in CATEGORIES:
        before, after = _kept(record.report, category), _kept(new, category)
        if before == after and was is now:
            continue
        kept_before, kept_after = _newest(was, category, before), _newest(now, category, after)
        for kind, moved in (("lost", _missing(kept_before, kept_after)), ("gained", _missing(kept_after, kept_before))):
            if not moved:
                continue
            if kind == "lost":
                tally.lost[category] += len(moved)
                lost_here += len(moved)
            else:
                tally.gained[category] += len(moved)
                gained_here += len(moved)
            room = examples - taken.get((category, kind), 0)
            if room > 0:
                shown = moved[:room]
                taken[(category, kind)] = taken.get((category, kind), 0) + len(shown)
                tally.examples.extend(
                    Change(record=record.id, agent=record.agent_id, tick=record.tick, category=category, change=kind,
                           item=msgspec.to_builtins(item))
                    for item in shown
                )
    if lost_here or gained_here:
        counts = tally.npcs.setdefault(record.agent_id, [0, 0])
        counts[0] += lost_here
        counts[1] += gained_here


def write_plot(tallies: Sequence[Tally], path: Path) -> None:
    """Items lost and gained per inference by category (one bar per variant), and prompt sizes."""
    from sim.loadtest import require_matplotlib  # here: the load test's package is not needed otherwise

    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # no display: write a file only
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(11, 6.4))
    try:
        grid = fig.add_gridspec(2, 2)
        width = 0.8 / max(len(tallies), 1)
        for column, (field, title) in enumerate((("lost", "items lost per inference"),
                                                 ("gained", "items gained per inference"))):
            axes = fig.add_subplot(grid[0, column])
            for j, tally in enumerate(tallies):
                counts = getattr(tally, field)
                values = [counts[c] / max(tally.inferences, 1) for c in CATEGORIES]
                offset = (j - (len(tallies) - 1) / 2) * width
                axes.bar([i + offset for i in range(len(CATEGORIES))], values, width, label=tally.label)
            axes.set_xticks(range(len(CATEGORIES)), list(CATEGORIES), fontsize=8)
            axes.set_title(title, fontsize=10)
            axes.legend(loc="best", fontsize=7)
        sizes = fig.add_subplot(grid[1, :])
        labels = [t.label for t in tallies]
        sizes.bar(labels, [t.chars / max(t.inferences, 1) for t in tallies], label="mean prompt chars")
        if tallies:
            sizes.axhline(tallies[0].recorded_chars / max(tallies[0].inferences, 1), color="grey", linestyle=":",
                          label="recorded mean")
        sizes.set_ylabel("characters")
        sizes.set_title("prompt size; over budget: " + ", ".join(f"{t.over_budget}" for t in tallies), fontsize=10)
        sizes.legend(loc="best", fontsize=8)
        fig.suptitle(f"npcsim replay what-if: {tallies[0].inferences if tallies else 0:,} inferences per variant")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
