"""Building an ephemeral working memory with priority truncation (DESIGN.md, the heart).

`build_working_memory` is a pure function: same state, input and config give the same
bytes. Sizes are exact because the prompt is a concatenation of pieces whose sizes the
state computed once (see `_render`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from sim.errors import OverBudgetError
from sim.memory._config import WorkingMemoryConfig
from sim.memory._render import RenderedState, Section, render_tail
from sim.memory._state import Belief, Episode, Fact, Line, NpcState, WorldFact
from sim.memory._tokens import token_counter

__all__ = ["CategoryReport", "TruncationReport", "WorkingMemory", "build_working_memory"]

# Redistribution order (dialogue, then episodic, then beliefs) and the prompt's order.
FLEXIBLE = ("dialogue", "episodic", "beliefs")
ALWAYS = ("canonical_facts", "world_state")
RENDER_ORDER = ("canonical_facts", "world_state", "beliefs", "episodic", "dialogue")
# When the exact token count of the whole prompt is over the limit: trim the least
# important category first (truncatable mandatory ones were filled last).
TRIM_ORDER = ("world_state", "canonical_facts", "beliefs", "episodic", "dialogue")
_NO_CAP = 1 << 62


class CategoryReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one category was given and what it kept; sizes in characters (and tokens).

    `budget` is the category's share of the flexible budget (for a truncatable
    always-include category: what was left); `used` may exceed it when unused budget
    was redistributed.
    """

    budget: int
    used: int
    kept: int
    dropped: int
    budget_tokens: int | None = None
    used_tokens: int | None = None


class TruncationReport(msgspec.Struct, frozen=True, kw_only=True):
    limit_chars: int
    limit_tokens: int | None
    mandatory_chars: int
    mandatory_tokens: int | None
    prompt_chars: int
    prompt_tokens: int | None
    over_budget: bool
    canonical_facts: CategoryReport
    world_state: CategoryReport
    dialogue: CategoryReport
    episodic: CategoryReport
    beliefs: CategoryReport


class WorkingMemory(msgspec.Struct, frozen=True, kw_only=True):
    """One inference's context. Kept items are the state's own items, oldest first."""

    agent_id: str
    player_input: str
    prompt: str
    context_chars: int  # prompt[:context_chars] is everything before the "## Now" part
    canonical_facts: tuple[Fact, ...]
    world_state: tuple[WorldFact, ...]
    dialogue: tuple[Line, ...]
    episodic: tuple[Episode, ...]
    beliefs: tuple[Belief, ...]
    report: TruncationReport

    def messages(self) -> list[dict[str, str]]:
        """The same content in chat form: the context as system message, the input as user."""
        return [
            {"role": "system", "content": self.prompt[: self.context_chars]},
            {"role": "user", "content": self.player_input},
        ]


_DEFAULT_CONFIG = WorkingMemoryConfig()


def _extend(
    sizes: Sequence[int],
    header: int,
    kept: int,
    cap: int,
    room: int,
    token_sizes: Sequence[int] | None,
    token_header: int,
    token_room: int,
) -> tuple[int, int, int]:
    """Grow a category's newest-first run while the next whole item fits both rooms."""
    n = len(sizes)
    stop = cap if cap < n else n
    while kept < stop:
        i = n - 1 - kept
        cost = sizes[i] + header if kept == 0 else sizes[i]
        if cost > room:
            break
        if token_sizes is not None:
            token_cost = token_sizes[i] + token_header if kept == 0 else token_sizes[i]
            if token_cost > token_room:
                break
            token_room -= token_cost
        room -= cost
        kept += 1
    return kept, room, token_room


def _render_prompt(rendered: RenderedState, kept: dict[str, int], tail: str) -> tuple[str, int]:
    pieces = [rendered.head]
    for name in RENDER_ORDER:
        section: Section = getattr(rendered, name)
        k = kept[name]
        n = len(section.lines)
        if k == n:
            pieces.append(section.text)
        elif k:
            pieces.append(section.header)
            pieces.extend(section.lines[n - k :])
    context = "".join(pieces)
    return context + tail, len(context)


def build_working_memory(
    state: NpcState, player_input: str, config: WorkingMemoryConfig | None = None
) -> WorkingMemory:
    """Build a fresh, immutable working memory for one inference."""
    cfg = _DEFAULT_CONFIG if config is None else config
    rendered = state.rendered
    tail = render_tail(state.agent_id, player_input)
    always = {
        "canonical_facts": cfg.always_include_canonical_facts,
        "world_state": cfg.always_include_world_state,
    }
    caps = {
        "dialogue": cfg.max_dialogue_lines,
        "episodic": cfg.max_episodic_memories,
        "beliefs": cfg.max_beliefs,
        "canonical_facts": _NO_CAP,
        "world_state": _NO_CAP,
    }
    shares = {"dialogue": cfg.dialogue_share, "episodic": cfg.episodic_share, "beliefs": cfg.belief_share}
    mandatory_text = [rendered.head, tail]
    mandatory_chars = len(rendered.head) + len(tail)
    for name in ALWAYS:
        if always[name]:
            text = getattr(rendered, name).text
            mandatory_text.append(text)
            mandatory_chars += len(text)
    flex_chars = cfg.max_context_chars - mandatory_chars

    count: Callable[[str], int] | None = None
    mandatory_tokens: int | None = None
    flex_tokens = 0
    token_table = None
    if cfg.max_context_tokens is not None:
        count = token_counter(cfg.tokenizer)
        mandatory_only, _ = _render_prompt(
            rendered, {n: (len(getattr(rendered, n).lines) if always.get(n) else 0) for n in RENDER_ORDER}, tail
        )
        mandatory_tokens = count(mandatory_only)
        flex_tokens = cfg.max_context_tokens - mandatory_tokens
        token_table = state.token_sizes(count)

    kept = {name: (len(getattr(rendered, name).lines) if always.get(name) else 0) for name in RENDER_ORDER}
    budgets: dict[str, tuple[int, int]] = {name: (0, 0) for name in RENDER_ORDER}
    over_budget = flex_chars < 0 or flex_tokens < 0
    if over_budget:
        if cfg.on_overflow == "raise":
            raise OverBudgetError(_over_budget_message(state.agent_id, cfg, mandatory_chars, mandatory_tokens))
    else:

        def grow(name: str, room: int, token_room: int) -> tuple[int, int]:
            section: Section = getattr(rendered, name)
            token_sizes, token_header = getattr(token_table, name) if token_table is not None else (None, 0)
            kept[name], room, token_room = _extend(
                section.sizes, len(section.header), kept[name], caps[name], room,
                token_sizes, token_header, token_room,
            )
            return room, token_room

        used_chars = used_tokens = 0
        for name in FLEXIBLE:
            budget = (int(flex_chars * shares[name]), int(flex_tokens * shares[name]))
            budgets[name] = budget
            room, token_room = grow(name, *budget)
            used_chars += budget[0] - room
            used_tokens += budget[1] - token_room
        room, token_room = flex_chars - used_chars, flex_tokens - used_tokens
        if cfg.redistribute_unused:
            for name in FLEXIBLE:
                room, token_room = grow(name, room, token_room)
        for name in ALWAYS:
            if not always[name]:
                budgets[name] = (room, token_room)
                room, token_room = grow(name, room, token_room)

    prompt, context_chars = _render_prompt(rendered, kept, tail)
    prompt_tokens: int | None = None
    if count is not None and cfg.max_context_tokens is not None and not over_budget:
        prompt, context_chars, prompt_tokens = _fit_exact_tokens(
            rendered, kept, caps, tail, cfg, count, prompt, context_chars, always
        )
    elif count is not None:
        prompt_tokens = count(prompt)

    report = _report(rendered, kept, budgets, always, token_table, cfg, mandatory_chars, mandatory_tokens,
                     len(prompt), prompt_tokens, over_budget)
    return WorkingMemory(
        agent_id=state.agent_id,
        player_input=player_input,
        prompt=prompt,
        context_chars=context_chars,
        canonical_facts=_newest(state.canonical_facts, kept["canonical_facts"]),
        world_state=_newest(state.world_state, kept["world_state"]),
        dialogue=_newest(state.dialogue, kept["dialogue"]),
        episodic=_newest(state.episodic, kept["episodic"]),
        beliefs=_newest(state.beliefs, kept["beliefs"]),
        report=report,
    )


def _fit_exact_tokens(
    rendered: RenderedState,
    kept: dict[str, int],
    caps: dict[str, int],
    tail: str,
    cfg: WorkingMemoryConfig,
    count: Callable[[str], int],
    prompt: str,
    context_chars: int,
    always: dict[str, bool],
) -> tuple[str, int, int]:
    """Count the whole prompt once more, since tokens merge across item boundaries.

    Over the limit: drop the oldest kept item of the least important category until it
    fits. Then, with redistribution, offer each category its next item once more, counted
    exactly, so that the result is maximal in real tokens, not only in per-item counts.
    """
    assert cfg.max_context_tokens is not None
    limit = cfg.max_context_tokens
    tokens = count(prompt)
    truncatable = [n for n in TRIM_ORDER if not always.get(n, False)]
    while tokens > limit:
        name = next((n for n in truncatable if kept[n] > 0), None)
        if name is None:
            break
        kept[name] -= 1
        prompt, context_chars = _render_prompt(rendered, kept, tail)
        tokens = count(prompt)
    if cfg.redistribute_unused:
        order = list(FLEXIBLE) + [n for n in ALWAYS if not always[n]]
        grown = True
        while grown:
            grown = False
            for name in order:
                if kept[name] >= min(caps[name], len(getattr(rendered, name).lines)):
                    continue
                kept[name] += 1
                candidate, candidate_context = _render_prompt(rendered, kept, tail)
                if len(candidate) <= cfg.max_context_chars:
                    candidate_tokens = count(candidate)
                    if candidate_tokens <= limit:
                        prompt, context_chars, tokens = candidate, candidate_context, candidate_tokens
                        grown = True
                        continue
                kept[name] -= 1
    return prompt, context_chars, tokens


def _newest(items: tuple[msgspec.Struct, ...], k: int) -> tuple:  # type: ignore[type-arg]
    return items[len(items) - k :] if k else ()


def _report(
    rendered: RenderedState,
    kept: dict[str, int],
    budgets: dict[str, tuple[int, int]],
    always: dict[str, bool],
    token_table: object,
    cfg: WorkingMemoryConfig,
    mandatory_chars: int,
    mandatory_tokens: int | None,
    prompt_chars: int,
    prompt_tokens: int | None,
    over_budget: bool,
) -> TruncationReport:
    categories: dict[str, CategoryReport] = {}
    for name in RENDER_ORDER:
        section: Section = getattr(rendered, name)
        k = kept[name]
        n = len(section.lines)
        used = (len(section.header) + sum(section.sizes[n - k :])) if k else 0
        used_tokens: int | None = None
        budget_tokens: int | None = None
        if token_table is not None:
            sizes, header = getattr(token_table, name)
            used_tokens = (header + sum(sizes[n - k :])) if k else 0
            budget_tokens = used_tokens if always.get(name) else budgets[name][1]
        categories[name] = CategoryReport(
            budget=used if always.get(name) else budgets[name][0],
            used=used,
            kept=k,
            dropped=n - k,
            budget_tokens=budget_tokens,
            used_tokens=used_tokens,
        )
    return TruncationReport(
        limit_chars=cfg.max_context_chars,
        limit_tokens=cfg.max_context_tokens,
        mandatory_chars=mandatory_chars,
        mandatory_tokens=mandatory_tokens,
        prompt_chars=prompt_chars,
        prompt_tokens=prompt_tokens,
        over_budget=over_budget,
        **categories,
    )


def _over_budget_message(
    agent_id: str, cfg: WorkingMemoryConfig, mandatory_chars: int, mandatory_tokens: int | None
) -> str:
    parts = [f"{mandatory_chars} characters against max_context_chars={cfg.max_context_chars}"]
    if mandatory_tokens is not None:
        parts.append(f"{mandatory_tokens} tokens against max_context_tokens={cfg.max_context_tokens}")
    return (
        f"working memory for agent {agent_id!r}: the mandatory content (system prompt, input, "
        f"canonical facts, world state) alone is {' and '.join(parts)}; on_overflow='raise'"
    )
