"""`stable_prefix = true`: the start of a flexible category's kept run moves only in steps.

A model server reuses the longest prefix a prompt shares with the previous prompt of its
slot (llama.cpp's slots, vLLM's prefix caching). With the ordinary selection, as soon as a
category's oldest kept item no longer fits, its run starts one item later at every turn,
and every character after that point changes. Here a category keeps only what the
ordinary selection kept (after the exact token fit) from an anchor on:

- an item is an *anchor* when blake2b of its identity (an episode's or a belief's id; a
  line's tick, seq, speaker and text) falls below 1/K of the hash space, K =
  `anchor_every(cap)`. Whether an item is an anchor depends on the item alone, never on
  the build, the state's window or an earlier prompt: the core remembers nothing;
- with `o` the oldest kept position, the category keeps its kept items at positions >= s,
  s the oldest anchor at or after `o` and at or before the newest kept position, among its
  candidates (a memory a kept line says is none); with no such anchor it keeps the
  ordinary run.

So while the next build's ordinary start stays at or before s, s is again the oldest anchor
after it (there is none in [o, s)) and the category's text only grows at its end; once it
passes s, the start jumps to the next anchor, dropping several items at once. The newest
kept item is never dropped (s is at most its position; with recency it is the state's
newest). With `selection = "scored"` the same rule applies to the scored kept set: its
start moves in steps, but the items inside it may still change with their scores. A line
given up takes the memory it said with it (`sim.memory._duplicates`): that memory is
dropped, no longer a duplicate, and the memories' section, before the dialogue, stays as
the ordinary selection made it.

K is about one anchor in two to four items: `max(2, min(4, cap // 2))`. A larger K keeps a
start longer (about K - 1 appends between jumps) and costs more kept characters at each
jump (about (K - 1) / 2 items on average); a category capped at a few items cannot afford
to give up more than one or two of them.

Dropping whole items never exceeds a character budget; tokens merge across item boundaries,
so with a token limit the prompt is counted once more, and should it be over, the build
keeps the ordinary selection (`stabilise` returns what it was given).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

import msgspec

from sim.memory._selection import EPISODIC, FLEXIBLE, Category, Frame
from sim.memory._state import Belief, Episode, Line

__all__ = ["anchor_every", "is_anchor", "stabilise"]

_HASH_SPACE = 1 << 64


def anchor_every(cap: int) -> int:
    """K: about one item in K of a category capped at `cap` items is an anchor."""
    return max(2, min(4, cap // 2))


def is_anchor(item: Episode | Belief | Line, every: int) -> bool:
    """Whether `item` is an anchor, one in about `every` items: a function of its identity only."""
    identity = (item.tick, item.seq, item.speaker, item.text) if isinstance(item, Line) else (item.id,)
    digest = hashlib.blake2b(msgspec.json.encode(identity), digest_size=8).digest()
    return int.from_bytes(digest, "big") * every < _HASH_SPACE


def _stable_start(
    items: Sequence[Episode | Belief | Line], kept: list[int], every: int, left_out: frozenset[int]
) -> int | None:
    """The oldest anchor among the candidates from the oldest kept to the newest kept (the
    positions `left_out` are none); None when there is none."""
    return next((p for p in range(kept[0], kept[-1] + 1) if p not in left_out and is_anchor(items[p], every)), None)


def stabilise(
    frame: Frame,
    categories: Sequence[Category],
    items: Mapping[int, Sequence[Episode | Belief | Line]],
    count: Callable[[str], int] | None,
    limit_tokens: int | None,
    fitted: tuple[str, int, int | None],
    said: frozenset[int],
) -> tuple[str, int, int | None]:
    """Move each flexible category's start to its stable start; the prompt, its context's
    length and its tokens (None without a token limit).

    `items` are the state's items of each flexible category, by its index; `fitted` the
    ordinary selection's prompt, context length and tokens, given back, with `categories`
    as they were, when the stable prompt counts over `limit_tokens`; `said` the positions of
    the memories the ordinary selection's lines say: no candidates, never an anchor.
    """
    saved = [(category.kept, category.rank, category.sums, category.token_sums) for category in categories]
    moved = False
    for i in FLEXIBLE:
        category = categories[i]
        if not category.kept:
            continue
        kept = category.kept_positions()
        start = _stable_start(items[i], kept, anchor_every(category.cap), said if i == EPISODIC else frozenset())
        if start is not None and start > kept[0]:
            category.keep_from(start)
            moved = True
    if not moved:
        return fitted
    prompt, context_chars = frame.prompt(categories)
    if count is None:
        return prompt, context_chars, None
    tokens = count(prompt)
    if limit_tokens is not None and tokens > limit_tokens:  # restored in place: the builder holds the categories
        for category, before in zip(categories, saved, strict=True):
            category.kept, category.rank, category.sums, category.token_sums = before
        return fitted
    return prompt, context_chars, tokens
