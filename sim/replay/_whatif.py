"""What-if with recorded replies: each record's snapshot rebuilt under another config.

The world unfolds exactly as recorded, so the state snapshot an audit record holds is
what that model call would have been given under any budget; `build_working_memory` of
it with the variant's config is what the call would have seen, and no model, shard or
broker is needed. What a variant lost or gained against the original is the difference of
the two kept sets. A recency selection's kept items are the newest, as many as the record's
report says, the memories among those the kept lines do not say (`sim.memory.distinct`);
a scored selection's, and those of a record whose stable prefix gave something up (a line
given up takes its memory with it), are rebuilt from the record (its own config).
`duplicate` counts the memories a variant left out because a kept line of the dialogue says
them.

A variant that changes an NPC's output policy (`forbidden`, `intents`) has each of its
recorded replies judged again by the gates under the new rules (`sim.replay._flips`): the
parts whose verdict flips are counted and listed.

`what_if(records, variants, examples)` folds a run of records into one `Tally` per
variant; tallies of consecutive runs `add` up, so the pass spreads over processes
(`sim.replay.map_spans`) and reports what one process would. `write_plot` draws the
tallies as the load test draws its own (`--plot`, extra `plot`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from sim.audit import AuditRecord, prompt_sha256
from sim.errors import ConfigError
from sim.memory import (
    SELECTIONS,
    CategoryReport,
    NpcState,
    WorkingMemory,
    WorkingMemoryConfig,
    build_working_memory,
    distinct,
)
from sim.output import OutputPolicy
from sim.replay._flips import Flip, first_flips, flips
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

    def order(self) -> tuple[int, str, str, int, bool]:
        """Record order; in a record, the prompt's order of categories, what was lost before what was gained."""
        return (self.tick, self.agent, self.record, CATEGORIES.index(self.category), self.change == "gained")


def _zeros() -> dict[str, int]:
    return dict.fromkeys(CATEGORIES, 0)


def _no_selections() -> dict[str, int]:
    return dict.fromkeys(SELECTIONS, 0)


class Tally(msgspec.Struct, kw_only=True):
    """What one variant did over a run of records, against the recorded working memories.

    `npcs` maps an NPC to its [lost, gained] item counts (NPCs with a change only);
    `examples` are the first changes in record order, at most the asked number per
    category and kind of change. `selections` counts the working memories built per
    selection, `recorded_selections` the recorded ones'.
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
    selections: dict[str, int] = msgspec.field(default_factory=_no_selections)
    recorded_selections: dict[str, int] = msgspec.field(default_factory=_no_selections)
    examples: list[Change] = []
    judged: int = 0
    to_rejected: int = 0
    to_accepted: int = 0
    flips: list[Flip] = []

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
        for selection in SELECTIONS:
            self.selections[selection] += later.selections[selection]
            self.recorded_selections[selection] += later.recorded_selections[selection]
        merged = sorted([*self.examples, *later.examples], key=Change.order)
        self.examples = _first(merged, examples)
        self.judged += later.judged
        self.to_rejected += later.to_rejected
        self.to_accepted += later.to_accepted
        self.flips = first_flips(sorted([*self.flips, *later.flips], key=Flip.order), examples)


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


def _kept(record: AuditRecord, recorded: WorkingMemory | None, category: str) -> tuple[Any, ...]:
    """The items the recorded working memory kept: `recorded`'s when it was rebuilt, else the
    newest, as many as the report says (memories among those the kept lines do not say)."""
    if recorded is not None:
        items: tuple[Any, ...] = getattr(recorded, category)
        return items
    section: CategoryReport = getattr(record.report, category)
    state = record.state
    if category == "episodic":
        state = distinct(state, _kept(record, None, "dialogue")).state
    items = getattr(state, category)
    return items[len(items) - section.kept :] if section.kept else ()


def _moved(items: tuple[Any, ...], of: tuple[Any, ...], without: tuple[Any, ...]) -> list[Any]:
    """The items of `of` that `without` does not hold (equal items counted apart), oldest first."""
    left = Counter(of)
    left.subtract(without)
    moved = []
    for item in items:
        if left[item] > 0:
            left[item] -= 1
            moved.append(item)
    return moved


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
    rules = any(v.sets_policy for v in variants)
    for record in records:
        if rules and record.output is not None:
            _judge_again(tallies, variants, record, record.output, examples)
        state, report = record.state, record.report
        facts, world = len(state.canonical_facts), len(state.world_state)
        for n, tally in enumerate(tallies):
            config = configs.get(n, record.config, record.agent_id)
            memory = build_working_memory(_recalled_under(record, config), record.player_input, config)
            tally.inferences += 1
            changed = prompt_sha256(memory) != record.prompt_sha256
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
            tally.selections[new.selection] += 1
            tally.recorded_selections[report.selection] += 1
            if changed:
                _count_changes(tally, record, memory, examples, taken[n])
    return tallies


def _recalled_under(record: AuditRecord, config: WorkingMemoryConfig) -> NpcState:
    """The record's state as `config` recalls: without what recall brought back when `config`
    does not recall; as recorded when it recalls as the run did. Recall anew needs what the NPC
    kept then, which no snapshot holds: a ConfigError names the fork that re-executes it."""
    recalls = config.scored.recall if config.selection == "scored" else 0
    recorded = record.config.scored.recall if record.config.selection == "scored" else 0
    if recalls == recorded or (not record.recalled and not recalls):
        return record.state
    if recalls:
        raise ConfigError(
            f"memory.scored.recall={recalls}: a what-if can turn recall off (recall=0), not recall anew (the run "
            f"recalled {recorded}): fork the run instead (npcsim replay --fork-at TICK --set memory.scored.recall=N)"
        )
    gone = frozenset(record.recalled)
    return msgspec.structs.replace(record.state, episodic=tuple(e for e in record.state.episodic if e.id not in gone))


def _judge_again(
    tallies: list[Tally], variants: Sequence[Variant], record: AuditRecord, recorded: OutputPolicy, examples: int
) -> None:
    """Each variant whose rules for the record's NPC differ from the recorded ones judges its replies again."""
    memory: WorkingMemory | None = None
    for tally, variant in zip(tallies, variants, strict=True):
        policy = variant.policy(recorded, record.agent_id)
        if policy == recorded:
            continue
        if memory is None:
            memory = record.memory()
        judged, found = flips(record, memory, policy)
        tally.judged += judged
        for flip in found:
            if flip.now == "rejected":
                tally.to_rejected += 1
            else:
                tally.to_accepted += 1
        tally.flips = first_flips([*tally.flips, *found], examples)


def _count_changes(
    tally: Tally, record: AuditRecord, memory: WorkingMemory, examples: int, taken: dict[tuple[str, str], int]
) -> None:
    recorded = record.memory() if record.report.selection != "recency" or record.report.stable_cost_chars else None
    here = {"lost": 0, "gained": 0}
    for category in CATEGORIES:
        before, after = _kept(record, recorded, category), getattr(memory, category)
        if before == after:
            continue
        items: tuple[Any, ...] = getattr(record.state, category)
        for kind, moved in (("lost", _moved(items, before, after)), ("gained", _moved(items, after, before))):
            (tally.lost if kind == "lost" else tally.gained)[category] += len(moved)
            here[kind] += len(moved)
            room = examples - taken.get((category, kind), 0)
            if room > 0 and moved:
                shown = moved[:room]
                taken[(category, kind)] = taken.get((category, kind), 0) + len(shown)
                tally.examples.extend(
                    Change(record=record.id, agent=record.agent_id, tick=record.tick, category=category,
                           change=kind, item=msgspec.to_builtins(item))
                    for item in shown
                )
    if here["lost"] or here["gained"]:
        counts = tally.npcs.setdefault(record.agent_id, [0, 0])
        counts[0] += here["lost"]
        counts[1] += here["gained"]


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
