"""The independent checker of a working memory in the log layout (docs/working-memory.md, "The
log layout"), re-derived from the state on its own.

The log's candidates are every line and every memory whose event no line of the state
records, in the checker's own order (tick, a memory before a line, then recency). The log
is the longest run of kept candidates at the end of that order, less memories at its head
that the prompt lists as recalled instead: the checker renders each such split and the
prompt must be one of them. It then checks:
- L3: no kept line outside the log; at most `max_dialogue_lines` lines and
  `max_episodic_memories` memories (the log's and the recalled together); recalled memories
  only with a scored selection, each older than the log; beliefs, and facts and world
  state when truncatable, as the sections checker checks them (the first of their order);
- L4: without a token limit, the log starts at its first candidate, or at an anchor, or
  holds none (its start moves in chunks; the anchors computed here on their own);
- I8: no kept memory says what a kept line says, and the report's duplicates are those;
- I1 and I2 as in the sections layout;
- I6 (recency, redistribution, no chunk given up, characters): the log's next older
  candidate did not fit (its kind's cap, or the limit).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from sim.checkers._common import RECENCY, anchor, category_orders, check_limits, limit_of, recency_history, said
from sim.checkers.violation import Violation
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig
from sim.memory.render import (
    CATEGORY_HEADERS,
    LOG_HEADER,
    RECALLED_HEADER,
    RENDER,
    render_head,
    render_rule,
    render_tail,
)

__all__ = ["check_log_memory"]

_BEFORE_LOG = ("canonical_facts", "world_state", "beliefs")


def _candidates(state: NpcState) -> list[Any]:
    """The log's candidates in the checker's order, oldest first."""
    told = said(state.dialogue)
    memories = [e for e in sorted(state.episodic, key=RECENCY["episodic"]) if e.event is None or e.event not in told]
    lines = sorted(state.dialogue, key=RECENCY["dialogue"])
    order = {id(item): n for n, item in enumerate([*memories, *lines])}
    return sorted([*memories, *lines], key=lambda item: (item.tick, hasattr(item, "speaker"), order[id(item)]))


def _outside(memories: Sequence[Any], log: Sequence[Any]) -> list[Any]:
    """The kept memories that are not in the log (as many of each as it does not hold)."""
    left = Counter(memories) - Counter(log)
    return list(left.elements())


def _render(state: NpcState, player_input: str, kept: dict[str, list[Any]], log: Sequence[Any],
            recalled: Sequence[Any], rule: str) -> str:
    parts = [render_head(state.system_prompt)]
    for name in _BEFORE_LOG:
        if kept[name]:
            parts.append(CATEGORY_HEADERS[name])
            parts.extend(RENDER[name](item) for item in kept[name])
    if log:
        parts.append(LOG_HEADER)
        parts.extend(RENDER["dialogue" if hasattr(item, "speaker") else "episodic"](item) for item in log)
    if recalled:
        parts.append(RECALLED_HEADER)
        parts.extend(RENDER["episodic"](item) for item in sorted(recalled, key=RECENCY["episodic"]))
    parts.append(rule)
    parts.append(render_tail(state.agent_id, player_input))
    return "".join(parts)


def check_log_memory(
    state: NpcState, player_input: str, config: WorkingMemoryConfig, wm: WorkingMemory
) -> list[Violation]:
    """Every invariant the log layout's snapshot breaks; empty when it is sound."""
    out: list[Violation] = []
    history = recency_history(state)
    kept = {name: list(getattr(wm, name)) for name in ("canonical_facts", "world_state", "beliefs", "dialogue",
                                                        "episodic")}
    fits, count = limit_of(config)
    rule = render_rule(wm.prohibition)
    candidates = _candidates(state)
    remaining = Counter([*kept["dialogue"], *kept["episodic"]])  # equal items may recur: counted
    start = len(candidates)
    while start > 0 and remaining[candidates[start - 1]] > 0:
        remaining[candidates[start - 1]] -= 1
        start -= 1
    # the split between the log and the recalled: memories at the run's head may be recalled
    splits = [start]
    while splits[-1] < len(candidates) and not hasattr(candidates[splits[-1]], "speaker"):
        splits.append(splits[-1] + 1)
    split = next((s for s in splits if wm.prompt == _render(
        state, player_input, kept, candidates[s:], _outside(kept["episodic"], candidates[s:]), rule)), None)
    if split is None:
        out.append(Violation("I2", "the prompt is not a log-layout rendering of the kept items"))
        split = start
    log = candidates[split:]
    recalled = _outside(kept["episodic"], log)
    in_log = Counter(log)

    # L3: the log's run, its caps, the recalled, and the categories before the log.
    if Counter(kept["dialogue"]) - in_log:
        out.append(Violation("L3", "a kept line is not in the log's run"))
    if len(kept["dialogue"]) > config.max_dialogue_lines:
        out.append(Violation("L3", f"dialogue: kept {len(kept['dialogue'])} lines, over the cap"))
    if len(kept["episodic"]) > config.max_episodic_memories:
        out.append(Violation("L3", f"episodic: kept {len(kept['episodic'])} memories, over the cap"))
    if recalled and config.selection != "scored":
        out.append(Violation("L3", "memories recalled outside the log under the recency selection"))
    head = (log[0].tick, 0) if log else None
    if head is not None and any((e.tick, 0) > head for e in recalled):
        out.append(Violation("L3", "a recalled memory is newer than the log's start"))
    orders = category_orders(state, player_input, config)
    for name in _BEFORE_LOG:
        order, k = orders[name], len(kept[name])
        if k > len(order) or kept[name] != sorted(order[:k], key=RECENCY[name]):
            out.append(Violation("L3", f"{name}: kept items are not the first of its order"))
    if len(kept["beliefs"]) > config.max_beliefs:
        out.append(Violation("L3", f"beliefs: kept {len(kept['beliefs'])}, over the cap"))

    # L4: the start moves in chunks.
    every = max(2, min(4, (config.max_dialogue_lines + config.max_episodic_memories) // 2))
    if (config.max_context_tokens is None and log and split > 0 and not anchor(log[0], every)
            and any(anchor(e, every) for e in log)):
        out.append(Violation("L4", "the log starts at no anchor, yet holds one"))

    # I8: nothing said twice.
    told = said(kept["dialogue"])
    if any(e.event is not None and e.event in told for e in kept["episodic"]):
        out.append(Violation("I8", "a kept memory is said again by a kept line"))
    row = wm.report.episodic
    duplicates = sum(1 for e in state.episodic if e.event is not None and e.event in told)
    if row.duplicate != duplicates or row.kept + row.dropped + row.duplicate != len(state.episodic):
        out.append(Violation("I8", f"the report counts {row.duplicate} duplicates, the kept lines say {duplicates}"))

    # I1, I2.
    mandatory = {name: (history[name] if getattr(config, f"always_include_{name}", False) else [])
                 for name in ("canonical_facts", "world_state", "beliefs", "dialogue", "episodic")}
    must_overflow = not fits(_render(state, player_input, mandatory, (), (), rule))
    out += check_limits(config, history, kept, wm, must_overflow, fits, count)

    # I6: the log's next older candidate did not fit.
    if (config.redistribute_unused and config.selection == "recency" and count is None and not must_overflow
            and not wm.report.stable_cost_chars and split > 0):
        nxt = candidates[split - 1]
        line = hasattr(nxt, "speaker")
        capped = (len(kept["dialogue"]) >= config.max_dialogue_lines if line
                  else len(kept["episodic"]) >= config.max_episodic_memories)
        grown = len(wm.prompt) + len(RENDER["dialogue" if line else "episodic"](nxt)) + (0 if log else len(LOG_HEADER))
        if not capped and grown <= config.max_context_chars:
            out.append(Violation("I6", "the log's next older item would have fitted but was dropped"))
    return out
