"""What the two working-memory checkers share (`sim.checkers.memory`, `sim.checkers.log_memory`):
the checker's own recency order and anchors, the candidates beside some lines, and the
checks of I1 (facts and world state there) and I2 (within the limit, over budget only when
it must be)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from sim.checkers.violation import Violation
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig, ranking, token_counter
from sim.memory.render import RENDER_ORDER, render_fact, render_world

__all__ = ["RECENCY", "anchor", "category_orders", "check_limits", "limit_of", "recency_history", "said", "unsaid"]


RECENCY: dict[str, Callable[[Any], tuple[Any, ...]]] = {
    "canonical_facts": lambda f: (f.id, f.text),
    "world_state": lambda w: (w.key, w.value),
    "beliefs": lambda b: (b.tick, b.id, b.text, b.confidence),
    "episodic": lambda e: (e.tick, e.id, e.text, e.significance, e.event or ""),
    "dialogue": lambda d: (d.tick, d.seq, d.speaker, d.text, d.event or ""),
}


def recency_history(state: NpcState) -> dict[str, list[Any]]:
    """The state's items in the checker's own recency order, sorted once per state."""
    cached: dict[str, list[Any]] | None = state.__dict__.get("_checker_history")
    if cached is None:
        cached = {name: sorted(getattr(state, name), key=RECENCY[name]) for name in RENDER_ORDER}
        state.__dict__["_checker_history"] = cached
    return cached


def category_orders(state: NpcState, player_input: str, config: WorkingMemoryConfig) -> dict[str, list[Any]]:
    """Each category's items in the order it keeps them: newest first, or a scored
    selection's ranking (the memories' candidates are these less what the kept lines say:
    `unsaid`)."""
    found = {name: items[::-1] for name, items in recency_history(state).items()}
    if config.selection == "scored":
        for name, rank in ranking(state, player_input, config).items():
            items = getattr(state, name)
            found[name] = [items[p] for p in rank]
    return found


def said(lines: Sequence[Any]) -> set[str]:
    return {line.event for line in lines if line.event is not None}


def unsaid(memories: Sequence[Any], lines: Sequence[Any]) -> list[Any]:
    """The memories no line of `lines` says (by its event): the candidates beside those lines."""
    told = said(lines)
    return [e for e in memories if e.event is None or e.event not in told]


def anchor(item: Any, every: int) -> bool:
    """The builder's anchors (sim.memory._stable), computed again: a line by its tick, seq,
    speaker and text, an episode or a belief by its id."""
    named = [item.tick, item.seq, item.speaker, item.text] if hasattr(item, "speaker") else [item.id]
    value = int.from_bytes(hashlib.blake2b(msgspec.json.encode(named), digest_size=8).digest(), "big")
    return value * every < 2**64


def limit_of(config: WorkingMemoryConfig) -> tuple[Callable[[str], bool], Callable[[str], int] | None]:
    """Whether a text is within the config's limits, and its token counter (None without a token limit)."""
    count = token_counter(config.tokenizer) if config.max_context_tokens is not None else None

    def fits(text: str) -> bool:
        if len(text) > config.max_context_chars:
            return False
        return count is None or config.max_context_tokens is None or count(text) <= config.max_context_tokens

    return fits, count


def check_limits(config: WorkingMemoryConfig, items: dict[str, list[Any]], kept: dict[str, list[Any]],
                 wm: WorkingMemory, must_overflow: bool, fits: Callable[[str], bool],
                 count: Callable[[str], int] | None) -> list[Violation]:
    """I1 and I2: `items` are the state's in the checker's order, `kept` the working memory's;
    `must_overflow` whether the mandatory content alone exceeds the limit; `fits` whether a
    text is within it."""
    out: list[Violation] = []
    prompt = wm.prompt
    always = {"canonical_facts": config.always_include_canonical_facts,
              "world_state": config.always_include_world_state}
    # I1: canonical facts and world state appear as rendered (inert), flags on.
    if always["canonical_facts"]:
        for fact in items["canonical_facts"]:
            if render_fact(fact) not in prompt or fact not in kept["canonical_facts"]:
                out.append(Violation("I1", f"canonical fact {fact.id!r} is missing from the prompt"))
    if always["world_state"]:
        for entry in items["world_state"]:
            if render_world(entry) not in prompt or entry not in kept["world_state"]:
                out.append(Violation("I1", f"world state {entry.key!r} is missing from the prompt"))

    # I2: within the limit unless over budget, and over budget only when it must be.
    mandatory = {name: (items[name] if always.get(name) else []) for name in RENDER_ORDER}
    if wm.report.over_budget != must_overflow:
        out.append(
            Violation("I2", f"over_budget is {wm.report.over_budget} but the mandatory content alone "
                      f"{'does not fit' if must_overflow else 'fits'} the limit")
        )
    if must_overflow:
        extra = [n for n in RENDER_ORDER if len(kept[n]) > len(mandatory[n])]
        if extra:
            out.append(Violation("I2", f"over budget, yet truncatable items were kept: {extra}"))
    elif not fits(prompt):
        tokens = f", {count(prompt)} tokens" if count is not None else ""
        out.append(Violation("I2", f"prompt is {len(prompt)} chars{tokens}, over the limit, and not flagged"))
    return out
