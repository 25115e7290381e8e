"""Choosing what a working memory keeps: each category's selection state, and the passes over it.

The builder (`sim.memory._build`) makes one `Category` per section of the prompt, in the
prompt's order; `select` fills each one's `kept` within the budgets (characters, and
per-item tokens when the config has a token limit), and `fit_exact_tokens` then counts the
whole prompt, since tokens merge across item boundaries. `Frame` renders the prompt from
the categories as they stand.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sim.memory._budget import WorkingMemoryConfig
from sim.memory.render import Section

__all__ = [
    "ALWAYS",
    "BELIEFS",
    "DIALOGUE",
    "EPISODIC",
    "FACTS",
    "FLEXIBLE",
    "NO_CAP",
    "WORLD",
    "Category",
    "Frame",
    "fit_exact_tokens",
    "select",
]

# Category indexes, in the prompt's order (RENDER_ORDER).
FACTS, WORLD, BELIEFS, EPISODIC, DIALOGUE = range(5)
ALWAYS = (FACTS, WORLD)
# Redistribution order: dialogue, then episodic, then beliefs.
FLEXIBLE = (DIALOGUE, EPISODIC, BELIEFS)
# When the exact token count of the whole prompt is over the limit: trim the least
# important category first (truncatable always-include ones were filled last).
TRIM_ORDER = (WORLD, FACTS, BELIEFS, EPISODIC, DIALOGUE)
NO_CAP = 1 << 62


@dataclass(slots=True)
class Category:
    """One category's selection state: its rendered items, their sizes, its limits, what it keeps.

    `always`: an always-include category is mandatory content and keeps every item.
    `sums[k]` is the size of its k first items in the order it selects from: newest first
    (`Section.newest_sums`), or with `rank` (item positions, the oldest 0, best first: a
    scored selection, `order_by`) in that order, up to its cap. `token_sums` and
    `token_header` are the same in tokens when the config has a token limit, else None.
    `budget` is (characters, tokens): its share of the flexible budget, or for a
    truncatable always-include category what was left when its turn came; `kept` counts
    the first items it keeps, in its order.
    """

    section: Section
    cap: int
    always: bool
    sums: tuple[int, ...]
    token_sums: tuple[int, ...] | None = None
    token_header: int = 0
    budget: tuple[int, int] = (0, 0)
    kept: int = 0
    rank: tuple[int, ...] | None = None

    def keeps_all_it_may(self) -> bool:
        return self.kept >= min(self.cap, len(self.sums) - 1)

    def order_by(self, rank: tuple[int, ...]) -> None:
        """Select in the order of `rank` instead of newest first (a rank that is the newest
        first keeps the newest-first sizes: the same choice, computed once per state)."""
        lines = self.section.lines
        n = len(lines)
        if rank == tuple(range(n - 1, n - 1 - len(rank), -1)):
            return
        self.rank = rank
        self.sums = (0, *itertools.accumulate([len(lines[p]) for p in rank]))
        if self.token_sums is not None:
            sums = self.token_sums  # the item at position p is the (n - p)-th newest
            self.token_sums = (0, *itertools.accumulate([sums[n - p] - sums[n - p - 1] for p in rank]))

    def kept_positions(self) -> list[int]:
        """The positions of the kept items in the state (the oldest is 0), oldest first."""
        n, k = len(self.section.lines), self.kept
        return sorted(self.rank[:k]) if self.rank is not None else list(range(n - k, n))

    def keep_from(self, start: int) -> None:
        """Keep only the kept items at positions `start` or later (`sim.memory._stable`); with
        a rank, the ones kept come first in it, so `kept` still counts its first items."""
        if self.rank is None:
            self.kept = min(self.kept, len(self.section.lines) - start)
            return
        rank, k = self.rank, self.kept
        kept = [i for i in range(k) if rank[i] >= start]
        order = kept + [i for i in range(k) if rank[i] < start] + list(range(k, len(rank)))
        self.rank = tuple([rank[i] for i in order])
        self.sums = _reordered(self.sums, order)
        if self.token_sums is not None:
            self.token_sums = _reordered(self.token_sums, order)
        self.kept = len(kept)

    def grow(self, room: int, token_room: int) -> tuple[int, int]:
        """Keep more of the first items while the next whole item fits both rooms; the rooms left.

        `sums[k]` is the size of the k first items; the first item kept also pays the
        header. Sizes are positive (every rendered item ends with a newline), so sums
        increase and the longest fitting run is one bisection.
        """
        sums = self.sums
        n = len(sums) - 1
        stop = self.cap if self.cap < n else n
        kept = self.kept
        if kept >= stop:
            return room, token_room
        base = sums[kept] - (len(self.section.header) if kept == 0 else 0)
        k = max(kept, bisect_right(sums, base + room, kept, stop + 1) - 1)
        if self.token_sums is not None:
            token_base = self.token_sums[kept] - (self.token_header if kept == 0 else 0)
            k = min(k, max(kept, bisect_right(self.token_sums, token_base + token_room, kept, stop + 1) - 1))
            if k > kept:
                token_room -= self.token_sums[k] - token_base
        if k > kept:
            room -= sums[k] - base
        self.kept = k
        return room, token_room


def _reordered(sums: tuple[int, ...], order: list[int]) -> tuple[int, ...]:
    """Running totals of the same items' sizes taken in `order` (indexes in the current one)."""
    return (0, *itertools.accumulate([sums[i + 1] - sums[i] for i in order]))


class Frame(NamedTuple):
    """What surrounds the sections: the head, a retry's rule section ("" otherwise) and the
    closing piece (a named tuple: made once per build, it costs a third of a frozen dataclass)."""

    head: str
    rule: str
    closing: str

    def prompt(self, categories: Sequence[Category]) -> tuple[str, int]:
        """The prompt of the categories as they stand, and the length of its context."""
        pieces = [self.head]
        for category in categories:
            section, k = category.section, category.kept
            n = len(section.lines)
            if k == n:
                pieces.append(section.text)
            elif k and category.rank is not None:
                pieces.append(section.header)
                lines = section.lines
                pieces.extend([lines[p] for p in category.kept_positions()])
            elif k:
                pieces.append(section.header)
                pieces.extend(section.lines[n - k :])
        pieces.append(self.rule)
        context = "".join(pieces)
        return context + self.closing, len(context)


def select(categories: Sequence[Category], flex: tuple[int, int], redistribute: bool) -> None:
    """Fill each category's `kept`: the fixed split first, then redistribution of what is left
    of `flex` (characters, tokens), then truncatable always-include categories."""
    if categories[FACTS].token_sums is None:  # no token limit
        # Fast path: a category whose whole capped run fits its share (fixed split), or
        # when all of them together fit the flexible budget (redistribution), keeps
        # exactly that run; no search is needed.
        full = [0, 0, 0, 0, 0]
        total = 0
        fits_share = True
        for i in FLEXIBLE:
            category = categories[i]
            k = min(category.cap, len(category.sums) - 1)
            cost = len(category.section.header) + category.sums[k] if k else 0
            full[i] = k
            total += cost
            fits_share = fits_share and cost <= categories[i].budget[0]
        facts, world = categories[FACTS], categories[WORLD]
        truncatable_empty = (facts.always or not facts.section.lines) and (world.always or not world.section.lines)
        if truncatable_empty and (fits_share or (redistribute and total <= flex[0])):
            for i in FLEXIBLE:
                categories[i].kept = full[i]
            return

    used_chars = used_tokens = 0
    for i in FLEXIBLE:
        budget_chars, budget_tokens = categories[i].budget
        room, token_room = categories[i].grow(budget_chars, budget_tokens)
        used_chars += budget_chars - room
        used_tokens += budget_tokens - token_room
    room, token_room = flex[0] - used_chars, flex[1] - used_tokens
    if redistribute:
        for i in FLEXIBLE:
            room, token_room = categories[i].grow(room, token_room)
    for i in ALWAYS:
        if not categories[i].always:
            categories[i].budget = (room, token_room)
            room, token_room = categories[i].grow(room, token_room)


def fit_exact_tokens(
    frame: Frame,
    categories: Sequence[Category],
    cfg: WorkingMemoryConfig,
    count: Callable[[str], int],
    fitted: tuple[str, int],
) -> tuple[str, int, int]:
    """Count the whole prompt (`fitted`: it and its context's length) once more; the prompt,
    its context's length and its tokens.

    Over the limit: drop the oldest kept item of the least important category until it
    fits. Then, with redistribution, offer each category its next item once more, counted
    exactly, so that the result is maximal in real tokens, not only in per-item counts.
    """
    assert cfg.max_context_tokens is not None
    limit = cfg.max_context_tokens
    prompt, context_chars = fitted
    tokens = count(prompt)
    truncatable = [categories[i] for i in TRIM_ORDER if not categories[i].always]
    while tokens > limit:
        victim = next((c for c in truncatable if c.kept > 0), None)
        if victim is None:
            break
        victim.kept -= 1
        prompt, context_chars = frame.prompt(categories)
        tokens = count(prompt)
    if cfg.redistribute_unused:
        order = [categories[i] for i in (*FLEXIBLE, *ALWAYS) if not categories[i].always]
        grown = True
        while grown:
            grown = False
            for category in order:
                if category.keeps_all_it_may():
                    continue
                category.kept += 1
                candidate, candidate_context = frame.prompt(categories)
                if len(candidate) <= cfg.max_context_chars:
                    candidate_tokens = count(candidate)
                    if candidate_tokens <= limit:
                        prompt, context_chars, tokens = candidate, candidate_context, candidate_tokens
                        grown = True
                        continue
                category.kept -= 1
    return prompt, context_chars, tokens
