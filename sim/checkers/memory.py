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

from collections.abc import Mapping, Sequence
from typing import Any

from sim.checkers._common import RECENCY, anchor, category_orders, check_limits, limit_of, recency_history, said, unsaid
from sim.checkers.log_memory import check_log_memory
from sim.checkers.violation import Violation
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig
from sim.memory.render import (
    CATEGORY_HEADERS,
    RENDER,
    RENDER_ORDER,
    render_head,
    render_rule,
    render_tail,
)

__all__ = ["check_working_memory"]


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


def _stable_keeps(name: str, run: Sequence[Any], candidates: Sequence[Any], cap: int) -> list[Any]:
    """What `stable_prefix` keeps of an ordinary run of candidates, oldest first: from the
    oldest anchor from its oldest item to its newest on (the whole run when there is none)."""
    key = RECENCY[name]
    ordered = sorted(run, key=key)
    if not ordered:
        return ordered
    oldest, newest = key(ordered[0]), key(ordered[-1])
    every = max(2, min(4, cap // 2))
    later = sorted((c for c in candidates if oldest <= key(c) <= newest), key=key)
    start = next((c for c in later if anchor(c, every)), None)
    return ordered if start is None else [item for item in ordered if key(item) >= key(start)]


def _stable_runs(name: str, order: list[Any], kept: list[Any], cap: int) -> list[int]:
    """Each k within the cap whose first run of the order leaves `kept` once stabilised."""
    limit = min(cap, len(order))
    return [k for k in range(len(kept), limit + 1) if _stable_keeps(name, order[:k], order, cap) == kept]


def check_working_memory(
    state: NpcState, player_input: str, config: WorkingMemoryConfig, wm: WorkingMemory
) -> list[Violation]:
    """Every invariant the snapshot breaks; empty when it is sound."""
    if config.layout == "log":
        return check_log_memory(state, player_input, config, wm)
    out: list[Violation] = []
    history = recency_history(state)
    orders = category_orders(state, player_input, config)
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
    fits, count = limit_of(config)
    # I3: each category keeps the first of its candidates in its order (newest, or best
    # ranked), rendered oldest first, within its cap; the memories' candidates are those the
    # kept lines (with a stable prefix: the ordinary selection's) do not say.
    memories = orders["episodic"]
    orders["episodic"] = unsaid(memories, kept["dialogue"])
    for name in RENDER_ORDER:
        order, k = orders[name], len(kept[name])
        if config.stable_prefix and name in caps:
            if name == "episodic":
                lines = orders["dialogue"]
                runs = _stable_runs("dialogue", lines, kept["dialogue"], caps["dialogue"])
                choices = [unsaid(memories, lines[:n]) for n in runs] or [order]
            else:
                choices = [order]
            if not any(_stable_runs(name, choice, kept[name], caps[name]) for choice in choices):
                out.append(Violation("I3", f"{name}: kept items are not a stable start of the first candidates"))
        elif k > len(order) or kept[name] != sorted(order[:k], key=RECENCY[name]):
            out.append(Violation("I3", f"{name}: kept items are not the first candidates of its order"))
        if name in caps and k > caps[name]:
            out.append(Violation("I3", f"{name}: kept {k} items, over the cap {caps[name]}"))

    # I8: nothing said twice: no kept memory records the event of a kept line, and the
    # memories counted as duplicates are those the kept lines say.
    told = said(kept["dialogue"])
    for episode in kept["episodic"]:
        if episode.event is not None and episode.event in told:
            out.append(Violation("I8", f"memory {episode.id!r} is said again by a kept line of the dialogue"))
    row = wm.report.episodic
    duplicates = len(state.episodic) - len(unsaid(state.episodic, kept["dialogue"]))
    if row.duplicate != duplicates or row.kept + row.dropped + row.duplicate != len(state.episodic):
        out.append(Violation("I8", f"the report counts {row.duplicate} duplicates ({row.kept} kept, {row.dropped} "
                                   f"dropped), the kept lines say {duplicates} of {len(state.episodic)} memories"))

    prompt = wm.prompt
    rule = render_rule(wm.prohibition)
    if prompt != _render(state, player_input, kept, rule):
        out.append(Violation("I2", "the prompt is not the rendering of the kept items (hidden or altered text)"))

    mandatory = {name: (history[name] if always.get(name) else []) for name in RENDER_ORDER}
    must_overflow = not fits(_render(state, player_input, mandatory, rule))
    out += check_limits(config, history, kept, wm, must_overflow, fits, count)

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
                candidate[name] = sorted([nxt, *kept[name]], key=RECENCY[name])
                could = fits(_render(state, player_input, candidate, rule))
            if could:
                out.append(Violation("I6", f"{name}: the next item of its order would have fitted but was dropped"))
    return out
