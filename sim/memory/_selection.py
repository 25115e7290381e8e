"""Choosing what a working memory keeps: each category's selection state, and the passes over it.

The builder (`sim.memory._build`) makes one `Category` per section of the prompt, in the
prompt's order; `select` fills each one's `kept` within the budgets (characters, and
per-item tokens when the config has a token limit), and `fit_exact_tokens` then counts the
whole prompt, since tokens merge across item boundaries. `Frame` renders the prompt from
the categories as they stand.

The dialogue is chosen first, and the memories' order has no memory a kept line carries
(`Duplicates`, `sim.memory._duplicates`): each pass that changes the dialogue's kept lines
brings the memories' order up to date, so a memory is left out exactly while its line is kept.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sim.memory._budget import WorkingMemoryConfig
from sim.memory._duplicates import Carried
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
    "Duplicates",
    "Frame",
    "fit_exact_tokens",
    "leading_categories",
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
    scored selection, or the memories without those the kept lines carry, `order_by`) in
    that order. `token_sums` and `token_header` are the same in tokens when the config has a
    token limit, else None; `newest_token_sums` the tokens newest first, what `order_by`
    takes the items' counts from.
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
    newest_token_sums: tuple[int, ...] | None = None

    def keeps_all_it_may(self) -> bool:
        return self.kept >= min(self.cap, len(self.sums) - 1)

    def used(self) -> tuple[int, int]:
        """The characters and tokens of its kept items, header included (0 when none)."""
        k = self.kept
        if not k:
            return 0, 0
        tokens = self.token_header + self.token_sums[k] if self.token_sums is not None else 0
        return len(self.section.header) + self.sums[k], tokens

    def order_by(self, rank: tuple[int, ...]) -> None:
        """Select in the order of `rank` instead of newest first (a rank that is the newest
        first as far as the cap reaches keeps the newest-first sizes: the same choice,
        computed once per state)."""
        lines = self.section.lines
        n = len(lines)
        if len(rank) >= min(self.cap, n) and rank == tuple(range(n - 1, n - 1 - len(rank), -1)):
            self.rank, self.sums, self.token_sums = None, self.section.newest_sums, self.newest_token_sums
            return
        self.rank = rank
        self.sums = (0, *itertools.accumulate([len(lines[p]) for p in rank]))
        if self.newest_token_sums is not None:
            sums = self.newest_token_sums  # the item at position p is the (n - p)-th newest
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


def leading_categories(sections: Sequence[Section], cfg: WorkingMemoryConfig) -> tuple[Category, Category, Category]:
    """The canonical facts, the world state (kept whole when always included) and the beliefs,
    from the rendered sections in RENDER_ORDER: both layouts start with them."""
    in_facts, in_world, in_beliefs = sections[FACTS], sections[WORLD], sections[BELIEFS]
    always_facts, always_world = cfg.always_include_canonical_facts, cfg.always_include_world_state
    return (
        Category(in_facts, NO_CAP, always_facts, in_facts.newest_sums, kept=len(in_facts.lines) if always_facts else 0),
        Category(in_world, NO_CAP, always_world, in_world.newest_sums, kept=len(in_world.lines) if always_world else 0),
        Category(in_beliefs, cfg.max_beliefs, False, in_beliefs.newest_sums),
    )


@dataclass(slots=True)
class Duplicates:
    """The memories the dialogue's kept lines carry, left out of the memories' order while
    their line is kept (`sim.memory._duplicates`).

    `lines` is what the state's lines carry; `order` the memories' whole order (positions,
    best or newest first, as far as the build ranks them); `left_out` the memories left out
    of it now.
    """

    dialogue: Category
    episodic: Category
    lines: Carried
    order: tuple[int, ...]
    left_out: frozenset[int] = frozenset()

    def said(self) -> frozenset[int]:
        """The memories the dialogue's kept lines carry."""
        return self.lines.said(self.dialogue.kept_positions())

    def sync(self) -> tuple[int, int]:
        """Bring the memories' order up to date with the dialogue's kept lines; the characters
        and tokens that kept memories now left out had used (a kept line says them now).

        The memories keep what they kept as far as it is the first of the new order: all of
        it but what lines just kept carry. A memory comes back into the order only when its
        line is dropped, which happens once no memory is kept (the exact token fit trims the
        memories before the lines).
        """
        left_out = self.said()
        if left_out == self.left_out:
            return 0, 0
        episodic = self.episodic
        before = episodic.used()
        kept = set(episodic.kept_positions())
        order = self.lines.unsaid(self.order, left_out)[: episodic.cap]  # the cap keeps no more
        self.left_out = left_out
        episodic.order_by(order)
        first = order[: len(kept)]
        episodic.kept = next((i for i, p in enumerate(first) if p not in kept), len(first))
        after = episodic.used()
        return before[0] - after[0], before[1] - after[1]

    def saved(self) -> _Saved:
        """The memories' order and kept run as they stand, for `restore` (an offer declined)."""
        episodic = self.episodic
        return self.left_out, episodic.kept, episodic.rank, episodic.sums, episodic.token_sums

    def restore(self, saved: _Saved) -> None:
        episodic = self.episodic
        self.left_out, episodic.kept, episodic.rank, episodic.sums, episodic.token_sums = saved


_Saved = tuple[frozenset[int], int, tuple[int, ...] | None, tuple[int, ...], tuple[int, ...] | None]


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


def select(
    categories: Sequence[Category], flex: tuple[int, int], redistribute: bool, duplicates: Duplicates | None
) -> None:
    """Fill each category's `kept`: the fixed split first, then redistribution of what is left
    of `flex` (characters, tokens), then truncatable always-include categories.

    The dialogue goes first in both: the memories are then chosen among those its kept lines
    do not carry (`duplicates`, None when no memory records the event of a line). A line it
    takes from what is left leaves out the memory it carries, and what that memory used is
    offered to the dialogue again, then to the others.
    """
    if categories[FACTS].token_sums is None and _whole_runs(categories, flex[0], redistribute, duplicates):
        return
    dialogue = categories[DIALOGUE]
    used_chars = used_tokens = 0
    for i in FLEXIBLE:
        budget_chars, budget_tokens = categories[i].budget
        room, token_room = categories[i].grow(budget_chars, budget_tokens)
        used_chars += budget_chars - room
        used_tokens += budget_tokens - token_room
        if i == DIALOGUE and duplicates is not None:
            duplicates.sync()  # no memory is kept yet: this only orders them
    room, token_room = flex[0] - used_chars, flex[1] - used_tokens
    if redistribute:
        for i in FLEXIBLE:
            room, token_room = categories[i].grow(room, token_room)
            while i == DIALOGUE and duplicates is not None:
                freed_chars, freed_tokens = duplicates.sync()
                if not (freed_chars or freed_tokens):
                    break
                room, token_room = dialogue.grow(room + freed_chars, token_room + freed_tokens)
    for i in ALWAYS:
        if not categories[i].always:
            categories[i].budget = (room, token_room)
            room, token_room = categories[i].grow(room, token_room)


def _whole_runs(categories: Sequence[Category], flex: int, redistribute: bool, duplicates: Duplicates | None) -> bool:
    """The fast path without a token limit: when every flexible category's whole capped run
    fits its share (fixed split), or all of them together fit the flexible budget
    (redistribution), each keeps exactly that run and no search is needed. With memories a
    line may carry, only when the dialogue's whole run fits its share: the fixed split then
    keeps it, and the memories' run is the one without what it carries, as `select`'s."""
    dialogue = categories[DIALOGUE]
    if duplicates is not None:
        k, cost = _whole(dialogue)
        if cost > dialogue.budget[0]:
            return False
        dialogue.kept = k
        duplicates.sync()  # the memories' order without what the dialogue's whole run carries
    facts, world = categories[FACTS], categories[WORLD]
    if not ((facts.always or not facts.section.lines) and (world.always or not world.section.lines)):
        dialogue.kept = 0
        return False
    runs = []  # a loop, not comprehensions: this is the common build's whole selection
    fits_share, total = True, 0
    for i in FLEXIBLE:
        category = categories[i]
        k, cost = _whole(category)
        runs.append(k)
        fits_share = fits_share and cost <= category.budget[0]
        total += cost
    if not (fits_share or (redistribute and total <= flex)):
        dialogue.kept = 0
        return False
    for i, k in zip(FLEXIBLE, runs, strict=True):
        categories[i].kept = k
    return True


def _whole(category: Category) -> tuple[int, int]:
    """Its whole capped run: how many items, and their characters with the header."""
    k = min(category.cap, len(category.sums) - 1)
    return k, (len(category.section.header) + category.sums[k] if k else 0)


def fit_exact_tokens(
    frame: Frame,
    categories: Sequence[Category],
    cfg: WorkingMemoryConfig,
    count: Callable[[str], int],
    fitted: tuple[str, int],
    duplicates: Duplicates | None,
) -> tuple[str, int, int]:
    """Count the whole prompt (`fitted`: it and its context's length) once more; the prompt,
    its context's length and its tokens.

    Over the limit: drop the oldest kept item of the least important category until it
    fits (a line dropped so, its memory is a candidate again: `duplicates`). Then, with
    redistribution, offer each category its next item once more, counted exactly, so that
    the result is maximal in real tokens, not only in per-item counts (a line offered so
    comes without the memory it carries).
    """
    assert cfg.max_context_tokens is not None
    limit = cfg.max_context_tokens
    prompt, context_chars = fitted
    tokens = count(prompt)
    dialogue = categories[DIALOGUE]
    truncatable = [categories[i] for i in TRIM_ORDER if not categories[i].always]
    while tokens > limit:
        victim = next((c for c in truncatable if c.kept > 0), None)
        if victim is None:
            break
        victim.kept -= 1
        if victim is dialogue and duplicates is not None:
            duplicates.sync()  # memories are trimmed before lines: none is kept
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
                saved = duplicates.saved() if duplicates is not None and category is dialogue else None
                category.kept += 1
                if duplicates is not None and saved is not None:
                    duplicates.sync()
                candidate, candidate_context = frame.prompt(categories)
                if len(candidate) <= cfg.max_context_chars:
                    candidate_tokens = count(candidate)
                    if candidate_tokens <= limit:
                        prompt, context_chars, tokens = candidate, candidate_context, candidate_tokens
                        grown = True
                        continue
                category.kept -= 1
                if duplicates is not None and saved is not None:
                    duplicates.restore(saved)
    return prompt, context_chars, tokens
