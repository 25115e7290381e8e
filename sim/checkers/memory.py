"""An independent checker of the working-memory invariants (docs/working-memory.md, I1-I8).

It trusts nothing the builder says about itself: it sorts the state's items on its own,
re-renders the prompt from the kept items with the format functions of the public
`sim.memory.render` (it checks the builder's choices, not the format of each piece), and
measures sizes on the rendered text. It derives the candidates on its own too: the
memories left once those whose event a kept line of the dialogue records are set aside.
With `selection = "scored"` a category's order is the public `sim.memory.ranking` of the
state, without those memories (it checks the choice made from the scores, not the scores'
formula). The builder's report is only checked against what the checker measured (an
`over_budget` flag is legitimate only when the mandatory content really exceeds the limit,
and the duplicates it counts are the memories the kept lines say).

With `stable_prefix`, I3 reads: a flexible category keeps what the stable start leaves of
the first k candidates of its order, for some k within its cap (the anchors computed here
on their own: blake2b of each item's identity); the memories' candidates are those the
ordinary selection's lines (the dialogue's first k, for such a k) do not say, since a line
stability gives up takes its memory with it. I6 holds of the ordinary selection, so it is
checked when the report says stability gave nothing up. Tests use it as the oracle;
`npcsim loadtest` runs it on every snapshot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from sim.checkers.violation import Violation
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig, ranking, token_counter
from sim.memory.render import (
    CATEGORY_HEADERS,
    RENDER,
    RENDER_ORDER,
    render_fact,
    render_head,
    render_rule,
    render_tail,
    render_world,
)

__all__ = ["check_working_memory"]


_RECENCY: dict[str, Callable[[Any], tuple[Any, ...]]] = {
    "canonical_facts": lambda f: (f.id, f.text),
    "world_state": lambda w: (w.key, w.value),
    "beliefs": lambda b: (b.tick, b.id, b.text, b.confidence),
    "episodic": lambda e: (e.tick, e.id, e.text, e.significance, e.event or ""),
    "dialogue": lambda d: (d.tick, d.seq, d.speaker, d.text, d.event or ""),
}


def _render(state: NpcState, player_input: str, kept: Mapping[str, Sequence[Any]], rule: str) -> str:
    parts = [render_head(state.system_prompt)]
    for name in RENDER_ORDER:
        items = kept[name]
        if items:
            parts.append(CATEGORY_HEADERS[name])
            parts.extend(RENDER[name](item) for item in items)
    parts.append(rule)
    parts.append(render_tail(state.agent_id, player_input))
    return "".join(parts)


def _history(state: NpcState) -> dict[str, list[Any]]:
    """The state's items in the checker's own recency order, sorted once per state."""
    cached: dict[str, list[Any]] | None = state.__dict__.get("_checker_history")
    if cached is None:
        cached = {name: sorted(getattr(state, name), key=_RECENCY[name]) for name in RENDER_ORDER}
        state.__dict__["_checker_history"] = cached
    return cached


def _orders(state: NpcState, player_input: str, config: WorkingMemoryConfig) -> dict[str, list[Any]]:
    """Each category's items in the order it keeps them: newest first, or a scored
    selection's ranking (the memories' candidates are these less what the kept lines say:
    `_unsaid`)."""
    orders = {name: items[::-1] for name, items in _history(state).items()}
    if config.selection == "scored":
        for name, rank in ranking(state, player_input, config).items():
            items = getattr(state, name)
            orders[name] = [items[p] for p in rank]
    return orders


def _said(lines: Sequence[Any]) -> set[str]:
    return {line.event for line in lines if line.event is not None}


def _unsaid(memories: Sequence[Any], lines: Sequence[Any]) -> list[Any]:
    """The memories no line of `lines` says (by its event): the candidates beside those lines."""
    said = _said(lines)
    return [e for e in memories if e.event is None or e.event not in said]


def _anchor(item: Any, every: int) -> bool:
    """The builder's anchors (sim.memory._stable), computed again: a line by its tick, seq,
    speaker and text, an episode or a belief by its id."""
    named = [item.tick, item.seq, item.speaker, item.text] if hasattr(item, "speaker") else [item.id]
    value = int.from_bytes(hashlib.blake2b(msgspec.json.encode(named), digest_size=8).digest(), "big")
    return value * every < 2**64


def _stable_keeps(name: str, run: Sequence[Any], candidates: Sequence[Any], cap: int) -> list[Any]:
    """What `stable_prefix` keeps of an ordinary run of candidates, oldest first: from the
    oldest anchor from its oldest item to its newest on (the whole run when there is none)."""
    key = _RECENCY[name]
    ordered = sorted(run, key=key)
    if not ordered:
        return ordered
    oldest, newest = key(ordered[0]), key(ordered[-1])
    every = max(2, min(4, cap // 2))
    later = sorted((c for c in candidates if oldest <= key(c) <= newest), key=key)
    start = next((c for c in later if _anchor(c, every)), None)
    return ordered if start is None else [item for item in ordered if key(item) >= key(start)]


def _stable_runs(name: str, order: list[Any], kept: list[Any], cap: int) -> list[int]:
    """Each k within the cap whose first run of the order leaves `kept` once stabilised."""
    limit = min(cap, len(order))
    return [k for k in range(len(kept), limit + 1) if _stable_keeps(name, order[:k], order, cap) == kept]


def check_working_memory(
    state: NpcState, player_input: str, config: WorkingMemoryConfig, wm: WorkingMemory
) -> list[Violation]:
    """Every invariant the snapshot breaks; empty when it is sound."""
    out: list[Violation] = []
    history = _history(state)
    orders = _orders(state, player_input, config)
    kept = {name: list(getattr(wm, name)) for name in RENDER_ORDER}
    always = {
        "canonical_facts": config.always_include_canonical_facts,
        "world_state": config.always_include_world_state,
    }
    caps = {
        "dialogue": config.max_dialogue_lines,
        "episodic": config.max_episodic_memories,
        "beliefs": config.max_beliefs,
    }
    count = token_counter(config.tokenizer) if config.max_context_tokens is not None else None

    def fits(text: str) -> bool:
        if len(text) > config.max_context_chars:
            return False
        return count is None or config.max_context_tokens is None or count(text) <= config.max_context_tokens

    # I3: each category keeps the first of its candidates in its order (newest, or best
    # ranked), rendered oldest first, within its cap; the memories' candidates are those the
    # kept lines (with a stable prefix: the ordinary selection's) do not say.
    memories = orders["episodic"]
    orders["episodic"] = _unsaid(memories, kept["dialogue"])
    for name in RENDER_ORDER:
        order, k = orders[name], len(kept[name])
        if config.stable_prefix and name in caps:
            if name == "episodic":
                lines = orders["dialogue"]
                runs = _stable_runs("dialogue", lines, kept["dialogue"], caps["dialogue"])
                choices = [_unsaid(memories, lines[:n]) for n in runs] or [order]
            else:
                choices = [order]
            if not any(_stable_runs(name, choice, kept[name], caps[name]) for choice in choices):
                out.append(Violation("I3", f"{name}: kept items are not a stable start of the first candidates"))
        elif k > len(order) or kept[name] != sorted(order[:k], key=_RECENCY[name]):
            out.append(Violation("I3", f"{name}: kept items are not the first candidates of its order"))
        if name in caps and k > caps[name]:
            out.append(Violation("I3", f"{name}: kept {k} items, over the cap {caps[name]}"))

    # I8: nothing said twice: no kept memory records the event of a kept line, and the
    # memories counted as duplicates are those the kept lines say.
    said = _said(kept["dialogue"])
    for episode in kept["episodic"]:
        if episode.event is not None and episode.event in said:
            out.append(Violation("I8", f"memory {episode.id!r} is said again by a kept line of the dialogue"))
    row = wm.report.episodic
    duplicates = len(state.episodic) - len(_unsaid(state.episodic, kept["dialogue"]))
    if row.duplicate != duplicates or row.kept + row.dropped + row.duplicate != len(state.episodic):
        out.append(Violation("I8", f"the report counts {row.duplicate} duplicates ({row.kept} kept, {row.dropped} "
                                   f"dropped), the kept lines say {duplicates} of {len(state.episodic)} memories"))

    prompt = wm.prompt
    rule = render_rule(wm.prohibition)
    if prompt != _render(state, player_input, kept, rule):
        out.append(Violation("I2", "the prompt is not the rendering of the kept items (hidden or altered text)"))

    # I1: canonical facts and world state appear as rendered (inert), flags on.
    if always["canonical_facts"]:
        for fact in history["canonical_facts"]:
            if render_fact(fact) not in prompt or fact not in kept["canonical_facts"]:
                out.append(Violation("I1", f"canonical fact {fact.id!r} is missing from the prompt"))
    if always["world_state"]:
        for entry in history["world_state"]:
            if render_world(entry) not in prompt or entry not in kept["world_state"]:
                out.append(Violation("I1", f"world state {entry.key!r} is missing from the prompt"))

    # I2: within the limit unless over budget, and over budget only when it must be.
    mandatory = {name: (history[name] if always.get(name) else []) for name in RENDER_ORDER}
    must_overflow = not fits(_render(state, player_input, mandatory, rule))
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

    # I6: with redistribution, no next item could have been added.
    if config.redistribute_unused and not must_overflow and not wm.report.stable_cost_chars:
        for name in RENDER_ORDER:
            order, k = orders[name], len(kept[name])
            if always.get(name) or k >= len(order) or k >= caps.get(name, len(order)):
                continue
            nxt = order[k]
            if count is None:
                # Adding an item inserts its line (and, into an empty section, the header).
                grown = len(prompt) + len(RENDER[name](nxt)) + (len(CATEGORY_HEADERS[name]) if k == 0 else 0)
                could = grown <= config.max_context_chars
            else:
                candidate = dict(kept)
                candidate[name] = sorted([nxt, *kept[name]], key=_RECENCY[name])
                could = fits(_render(state, player_input, candidate, rule))
            if could:
                out.append(Violation("I6", f"{name}: the next item of its order would have fitted but was dropped"))
    return out
