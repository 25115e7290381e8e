"""Why a working memory left out what it left out: derived from the snapshot, never stored.

A `TruncationReport` counts; `explain_truncation` names. It is a pure function of the
state, the input and the config (and of the working memory built from them, rebuilt when
not given), so audit records keep the report they always kept and whoever holds a record
(the CLI, the view, a test) can explain it the same way.

Reasons, per category. The kept items are the first of the candidates in the category's
order (I3): its newest, or with `selection = "scored"` its best ranked
(`sim.memory.ranking`); so every candidate after the first one dropped in that order
shares that item's reason:
- `cap`: the category's count cap was reached;
- `budget`: the next item did not fit what was left of the budget (characters or tokens);
- `over_budget`: the mandatory content alone took the whole limit, nothing flexible is kept;
- `stable_prefix`: the ordinary selection kept it, but `stable_prefix` started the category's
  run at a later anchor (`sim.memory._stable`); or, a memory, a line the ordinary selection
  kept said it, and that line was given up so. These come first among the dropped, in the
  category's order; the explanation finds them by building the ordinary selection once more
  (only when the report says stability cost something).
A memory that a kept line of the dialogue says already is no candidate
(`sim.memory._duplicates`): its reason is `duplicate`. The memories' candidates are the
others, those of lines the dialogue did not keep included.

Budgets, per category: `split` is its share of the flexible budget (limit minus mandatory
content) as the fixed split gives it; `final` is what it had once redistribution was done.
With `redistribute_unused` a category ends with what it used: more than its split when it
received what the others left unused, less when it left part of its split to them; without
it, a category has its split, used or not. An always-include category turned truncatable
has no share: it is filled from what the others left, so its split is 0 and its final what
it used. A mandatory category (always included) has what it takes. `unused_chars` is what
the prompt leaves of the limit, no further whole item having fitted (`unused_tokens` the
same in tokens, counted on the whole prompt: a category's `used_tokens` is the sum of its
items' counts, and tokens can merge across items).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import msgspec

from sim.memory._budget import WorkingMemoryConfig
from sim.memory._build import build_working_memory, counter_for
from sim.memory._duplicates import distinct
from sim.memory._log import build_log
from sim.memory._log_run import log_entries
from sim.memory._scoring import ranking
from sim.memory._snapshot import CategoryReport, TruncationReport, WorkingMemory
from sim.memory._state import Belief, Episode, Fact, Line, NpcState, WorldFact, item_text
from sim.memory._tokens import CountsMissing

__all__ = ["DROP_REASONS", "CategoryExplanation", "DropReason", "DroppedItem", "TruncationExplanation",
           "explain_truncation"]

DropReason = Literal["cap", "budget", "over_budget", "duplicate", "stable_prefix"]
DROP_REASONS: tuple[DropReason, ...] = ("cap", "budget", "over_budget", "duplicate", "stable_prefix")

# The report's order; the categories with a count cap and a share.
_CATEGORIES = ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs")
_FLEXIBLE = ("dialogue", "episodic", "beliefs")
_ALWAYS_FLAGS = {"canonical_facts": "always_include_canonical_facts", "world_state": "always_include_world_state"}
_CAPS = {"dialogue": "max_dialogue_lines", "episodic": "max_episodic_memories", "beliefs": "max_beliefs"}

Item = Fact | WorldFact | Episode | Belief | Line


class DroppedItem(msgspec.Struct, frozen=True, kw_only=True):
    """One item of the snapshot that the prompt does not hold, and why.

    `text` is the item as data: a fact's or a belief's text, a memory's text, `key: value`
    for world state, `speaker: text` for a line of dialogue. `tick` is None for the
    categories without one (canonical facts, world state).
    """

    category: str
    tick: int | None
    text: str
    reason: DropReason


class CategoryExplanation(msgspec.Struct, frozen=True, kw_only=True):
    """One category: its budget as split and after redistribution, its cap, what it kept and dropped.

    `dropped` is in the category's order, newest (or best ranked) first: first the items
    `stable_prefix` gave up, if any (then the memories of the lines it gave up, newest
    first), then the item that did not fit or passed the cap and those after it; after
    those, the duplicates (reason `duplicate`: a kept line says them), newest first.
    `reason` is the first dropped item's, None when truncation dropped nothing; `duplicate`
    counts the duplicates. `kept_items` are the kept items' texts (as a dropped item's),
    newest first. `mandatory`: always included (canonical facts and world state with their
    `always_include_*` flag), it takes what it needs before the split.
    """

    split: int
    final: int
    used: int
    kept: int
    cap: int | None
    reason: DropReason | None
    dropped: tuple[DroppedItem, ...]
    duplicate: int = 0
    kept_items: tuple[str, ...] = ()
    mandatory: bool = False
    split_tokens: int | None = None
    final_tokens: int | None = None
    used_tokens: int | None = None

    @property
    def received(self) -> int:
        """Characters taken from the others' unused budget (0 when none)."""
        return max(self.final - self.split, 0)

    @property
    def given(self) -> int:
        """Characters of its split left to the others, or unused (0 when none)."""
        return max(self.split - self.final, 0)


class TruncationExplanation(msgspec.Struct, frozen=True, kw_only=True):
    """Every category explained; `flexible_chars` is limit minus mandatory (negative: over budget)."""

    limit_chars: int
    limit_tokens: int | None
    mandatory_chars: int
    mandatory_tokens: int | None
    flexible_chars: int
    flexible_tokens: int | None
    unused_chars: int
    unused_tokens: int | None
    over_budget: bool
    redistributed: bool
    canonical_facts: CategoryExplanation
    world_state: CategoryExplanation
    dialogue: CategoryExplanation
    episodic: CategoryExplanation
    beliefs: CategoryExplanation

    def dropped(self) -> tuple[DroppedItem, ...]:
        """Every dropped item, category by category in the report's order, in each category's order."""
        return tuple(item for name in _CATEGORIES for item in getattr(self, name).dropped)


def explain_truncation(
    state: NpcState,
    player_input: str,
    config: WorkingMemoryConfig | None = None,
    memory: WorkingMemory | None = None,
    *,
    most_dropped: int | None = None,
    counts: Mapping[str, int] | None = None,
) -> TruncationExplanation:
    """Explain the working memory built from (`state`, `player_input`, `config`).

    `memory` is that working memory when the caller has it (it is rebuilt otherwise); it
    must have been built from these arguments: the explanation reads its report and takes
    the dropped items from `state`. `most_dropped` names only that many
    dropped items per category, the first of its `dropped` (a trace, after every inference,
    needs no more). `counts` are the server tokenizer's counts it was cut with
    (`build_working_memory`); what `stable_prefix` cost is told apart only where they also
    cut the ordinary selection.
    """
    cfg = WorkingMemoryConfig() if config is None else config
    if memory is None:
        memory = build_working_memory(state, player_input, cfg, counts=counts)
    report = memory.report
    ordinary = memory
    if report.stable_cost_chars and cfg.layout == "log":
        try:
            ordinary = build_log(state, player_input, cfg, memory.prohibition, counter_for(cfg, counts), chunked=False)
        except CountsMissing:
            ordinary = memory
    elif report.stable_cost_chars:
        unstable = msgspec.structs.replace(cfg, stable_prefix=False)
        try:
            ordinary = build_working_memory(state, player_input, unstable, prohibition=memory.prohibition,
                                            counts=counts)
        except CountsMissing:
            ordinary = memory
    if cfg.layout == "log":
        return _explained(report, cfg, _log_orders(state, player_input, cfg, memory, ordinary), memory, ordinary,
                          most_dropped)
    ranks = ranking(state, player_input, cfg) if cfg.selection == "scored" else {}
    # The memories' candidates: those no line of the ordinary selection says; of the others,
    # those a kept line says are duplicates, those of a line stability gave up went with it.
    candidates = distinct(state, ordinary.dialogue)
    duplicates = distinct(state, memory.dialogue).duplicates
    with_lines = tuple(e for e in reversed(candidates.duplicates) if e not in duplicates)
    orders: dict[str, _Order] = {}
    for name in _CATEGORIES:
        items: tuple[Item, ...] = getattr(state, name)
        ordered = [items[p] for p in ranks.get(name, range(len(items) - 1, -1, -1))]
        if name == "episodic" and candidates.duplicates:
            said = set(candidates.duplicates)
            orders[name] = _Order([item for item in ordered if item not in said], (with_lines, duplicates))
        else:
            orders[name] = _Order(ordered)
    return _explained(report, cfg, orders, memory, ordinary, most_dropped)


class _Order(NamedTuple):
    """A category's candidates in the order it keeps them, the ordinary selection's kept first;
    the memories no candidates (`_explain_category`'s `left_out`); the reason of the items
    truncation dropped, when the category's own count does not tell it."""

    ordered: Sequence[Item]
    left_out: tuple[tuple[Item, ...], tuple[Item, ...]] = ((), ())
    reason: DropReason | None = None


def _explained(report: TruncationReport, cfg: WorkingMemoryConfig, orders: Mapping[str, _Order],
               memory: WorkingMemory, ordinary: WorkingMemory, most_dropped: int | None) -> TruncationExplanation:
    over = report.over_budget
    flexible_chars = report.limit_chars - report.mandatory_chars
    flexible_tokens = None
    if report.limit_tokens is not None and report.mandatory_tokens is not None:
        flexible_tokens = report.limit_tokens - report.mandatory_tokens
    categories = {
        name: _explain_category(name, getattr(report, name), getattr(ordinary.report, name).kept, orders[name],
                                getattr(memory, name), cfg, over, most_dropped)
        for name in _CATEGORIES
    }
    unused_chars = 0 if over else report.limit_chars - report.prompt_chars
    unused_tokens = None
    if report.limit_tokens is not None and report.prompt_tokens is not None:
        unused_tokens = 0 if over else report.limit_tokens - report.prompt_tokens
    return TruncationExplanation(
        limit_chars=report.limit_chars,
        limit_tokens=report.limit_tokens,
        mandatory_chars=report.mandatory_chars,
        mandatory_tokens=report.mandatory_tokens,
        flexible_chars=flexible_chars,
        flexible_tokens=flexible_tokens,
        unused_chars=unused_chars,
        unused_tokens=unused_tokens,
        over_budget=over,
        redistributed=cfg.redistribute_unused,
        **categories,
    )


def _log_orders(state: NpcState, player_input: str, cfg: WorkingMemoryConfig, memory: WorkingMemory,
                ordinary: WorkingMemory) -> dict[str, _Order]:
    """The log layout's orders (`sim.memory._log`): the lines newest first; the memories the
    ordinary selection kept (the log's newest first, then the recalled, best ranked first),
    then the others newest first. What truncation dropped from the log shares the reason of
    the entry that stopped it: its kind's cap, or the budget."""
    entries = log_entries(state)
    kept_memories = set(ordinary.episodic)
    kept = set(ordinary.dialogue) | kept_memories
    start = len(entries)
    while start > 0 and entries[start - 1].item in kept:
        start -= 1
    reason: DropReason | None = "budget"
    if start > 0:
        stop = entries[start - 1]
        cap = cfg.max_dialogue_lines if stop.line else cfg.max_episodic_memories
        reason = "cap" if sum(1 for e in entries[start:] if e.line == stop.line) >= cap else "budget"
    lines = list(reversed(state.dialogue))
    log_memories = [e.item for e in reversed(entries[start:]) if not e.line]
    scored = ranking(state, player_input, cfg) if cfg.selection == "scored" else None
    ranks = scored["episodic"] if scored is not None else ()
    in_log = set(log_memories)
    recalled = [state.episodic[q] for q in ranks if state.episodic[q] in kept_memories
                and state.episodic[q] not in in_log]
    duplicates = distinct(state, memory.dialogue).duplicates
    with_lines = tuple(e for e in reversed(distinct(state, ordinary.dialogue).duplicates) if e not in duplicates)
    first = [*log_memories, *recalled]
    taken = {*first, *duplicates, *with_lines}
    rest = [e for e in reversed(state.episodic) if e not in taken]
    belief_order = [state.beliefs[p] for p in scored["beliefs"]] if scored is not None else list(
        reversed(state.beliefs))
    return {
        "canonical_facts": _Order(list(reversed(state.canonical_facts))),
        "world_state": _Order(list(reversed(state.world_state))),
        "dialogue": _Order(lines, reason=reason),
        # the recalled fill what the log left of the memories' cap: their own count tells
        "episodic": _Order([*first, *rest], (with_lines, duplicates), None if scored else reason),
        "beliefs": _Order(belief_order),
    }


def _explain_category(
    name: str, row: CategoryReport, ordinary: int, order: _Order, kept: tuple[Item, ...], cfg: WorkingMemoryConfig,
    over: bool, most_dropped: int | None,
) -> CategoryExplanation:
    """`ordinary`: how many items the ordinary selection kept (more than `row.kept` when
    `stable_prefix` gave some up); `ordered`: the category's candidates in the order it keeps
    them (newest, or best ranked, first), the ordinary selection's kept ones first; `kept`:
    the working memory's, oldest first; `left_out`: the memories that are no candidates, a
    line of the ordinary selection saying them: those whose line stability gave up (newest
    first), and the duplicates, whose line is kept (oldest first)."""
    ordered, (with_lines, duplicates) = order.ordered, order.left_out
    cap = getattr(cfg, _CAPS[name]) if name in _CAPS else None
    truncated: DropReason = "over_budget" if over else order.reason or (
        "cap" if cap is not None and ordinary >= cap else "budget")
    given_up: list[Item] = []
    if ordinary > row.kept:
        keeps = set(kept)
        given_up = [item for item in ordered[:ordinary] if item not in keeps]
    given_up += with_lines
    reason: DropReason | None = "stable_prefix" if given_up else truncated if row.dropped else None
    end = len(ordered) if most_dropped is None else min(ordinary + max(most_dropped - len(given_up), 0), len(ordered))
    dropped = tuple(
        DroppedItem(category=name, tick=_tick(item), text=item_text(item), reason="stable_prefix")
        for item in given_up[:most_dropped]
    ) + tuple(
        DroppedItem(category=name, tick=_tick(item), text=item_text(item), reason=truncated)
        for item in ordered[ordinary:end]
    )
    room = len(duplicates) if most_dropped is None else min(max(most_dropped - len(dropped), 0), len(duplicates))
    shown = duplicates[len(duplicates) - room :] if room else ()
    dropped += tuple(
        DroppedItem(category=name, tick=_tick(item), text=item_text(item), reason="duplicate")
        for item in reversed(shown)
    )
    kept_items = tuple(item_text(item) for item in reversed(kept))
    mandatory = name not in _FLEXIBLE and getattr(cfg, _ALWAYS_FLAGS[name])
    if name in _FLEXIBLE:
        split, split_tokens = row.budget, row.budget_tokens
        fixed = not cfg.redistribute_unused
        final, final_tokens = (split, split_tokens) if fixed else (row.used, row.used_tokens)
    elif mandatory:  # it has what it takes
        split = final = row.used
        split_tokens = final_tokens = row.used_tokens
    else:  # truncatable always-include: filled from what the others left
        split, final = 0, row.used
        split_tokens = None if row.used_tokens is None else 0
        final_tokens = row.used_tokens
    return CategoryExplanation(
        split=split, final=final, used=row.used, kept=row.kept, cap=cap, reason=reason, dropped=dropped,
        duplicate=len(duplicates), kept_items=kept_items, mandatory=mandatory, split_tokens=split_tokens,
        final_tokens=final_tokens, used_tokens=row.used_tokens,
    )


def _tick(item: Item) -> int | None:
    return None if isinstance(item, Fact | WorldFact) else item.tick
