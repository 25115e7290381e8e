"""Building an ephemeral working memory with priority truncation (DESIGN.md, the heart).

`build_working_memory` is a pure function: same state, input and config give the same
bytes. Sizes are exact because the prompt is a concatenation of pieces whose sizes the
rendering computed once per state (see `sim.memory.render.rendered`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from sim.errors import ConfigError, OverBudgetError
from sim.memory._budget import WorkingMemoryConfig, token_counter
from sim.memory._state import Belief, Episode, Fact, Line, NpcState, WorldFact
from sim.memory.render import (
    RENDERER_VERSION,
    RenderedState,
    Section,
    TokenSizes,
    escape_for,
    render_rule,
    render_tail,
    rendered,
    token_sizes,
)

__all__ = ["CategoryReport", "TruncationReport", "WorkingMemory", "build_working_memory"]

# Section indexes, in the prompt's order (RENDER_ORDER).
FACTS, WORLD, BELIEFS, EPISODIC, DIALOGUE = range(5)
ALWAYS = (FACTS, WORLD)
# Redistribution order: dialogue, then episodic, then beliefs.
FLEXIBLE = (DIALOGUE, EPISODIC, BELIEFS)
# When the exact token count of the whole prompt is over the limit: trim the least
# important category first (truncatable always-include ones were filled last).
TRIM_ORDER = (WORLD, FACTS, BELIEFS, EPISODIC, DIALOGUE)
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


class WorkingMemory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One inference's context. Kept items are the state's own items, oldest first.

    `prohibition` is a retry's rule (mandatory content, rendered in the prompt). Fields
    added later have defaults that are omitted from the encoding, so a memory rebuilt
    with renderer 1 encodes exactly as it did when renderer 1 was current: `renderer`
    defaults to 1 for that reason, though every memory built now says 3, and
    `system_chars` is 0 for renderers 1 and 2.
    """

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
    prohibition: str | None = None
    renderer: int = 1
    system_chars: int = 0  # renderer 3: prompt[:system_chars] is the system prompt and the canonical facts

    def messages(self) -> list[dict[str, str]]:
        """The same content in chat form: a system message and a user message.

        Renderer 3: the system message is the author's text only (the system prompt and
        the canonical facts); everything that carries outside words (world state, which
        the game system changes over MQTT, beliefs, memories, dialogue, a retry's rule and
        the input) is the user message, the prompt's text up to its closing cue. Renderers
        1 and 2 (their records replay as written): the context as system message, the
        input as user message, rendered by the record's escape.
        """
        if self.renderer < 3:
            return [
                {"role": "system", "content": self.prompt[: self.context_chars]},
                {"role": "user", "content": escape_for(self.renderer)(self.player_input)},
            ]
        cue = len(self.prompt) - len(self.agent_id) - 1  # the prompt ends with "{agent_id}:"
        return [
            {"role": "system", "content": self.prompt[: self.system_chars].removesuffix("\n")},
            {"role": "user", "content": self.prompt[self.system_chars : cue].removeprefix("\n").removesuffix("\n")},
        ]

    def sent_text(self, form: str) -> str:
        """What a model is given, as the audit records it: the prompt ("text"), or for the
        chat endpoint ("chat") the messages' contents in order, joined by a blank line."""
        if form == "chat":
            return "\n\n".join(m["content"] for m in self.messages())
        if form == "text":
            return self.prompt
        raise ConfigError(f"form must be 'text' or 'chat', got {form!r}")


_DEFAULT_CONFIG = WorkingMemoryConfig()


def _grow(
    sums: Sequence[int],
    header: int,
    kept: int,
    cap: int,
    room: int,
    token_sums: Sequence[int] | None,
    token_header: int,
    token_room: int,
) -> tuple[int, int, int]:
    """Grow a newest-first run from `kept` items while the next whole item fits both rooms.

    `sums[k]` is the size of the k newest items; the first item kept also pays the header.
    Sizes are positive (every rendered item ends with a newline), so sums increase and the
    longest fitting run is one bisection.
    """
    n = len(sums) - 1
    stop = cap if cap < n else n
    if kept >= stop:
        return kept, room, token_room
    base = sums[kept] - (header if kept == 0 else 0)
    k = max(kept, bisect_right(sums, base + room, kept, stop + 1) - 1)
    if token_sums is not None:
        token_base = token_sums[kept] - (token_header if kept == 0 else 0)
        k = min(k, max(kept, bisect_right(token_sums, token_base + token_room, kept, stop + 1) - 1))
        if k > kept:
            token_room -= token_sums[k] - token_base
    if k > kept:
        room -= sums[k] - base
    return k, room, token_room


def _render_prompt(rendering: RenderedState, kept: list[int], tail: tuple[str, str]) -> tuple[str, int]:
    """The prompt and the length of its context; `tail` is (rule section, closing piece)."""
    pieces = [rendering.head]
    for section, k in zip(rendering.sections, kept, strict=True):
        n = len(section.lines)
        if k == n:
            pieces.append(section.text)
        elif k:
            pieces.append(section.header)
            pieces.extend(section.lines[n - k :])
    pieces.append(tail[0])
    context = "".join(pieces)
    return context + tail[1], len(context)


def build_working_memory(
    state: NpcState,
    player_input: str,
    config: WorkingMemoryConfig | None = None,
    *,
    prohibition: str | None = None,
    renderer: int = RENDERER_VERSION,
) -> WorkingMemory:
    """Build a fresh, immutable working memory for one inference.

    `prohibition` makes it a retry's memory: the rule is mandatory content inside the same
    budget, so flexible items make room for it. `renderer` is for replaying old records.
    """
    cfg = _DEFAULT_CONFIG if config is None else config
    escape = escape_for(renderer)
    rendering = rendered(state, renderer)
    sections = rendering.sections
    tail = (render_rule(prohibition, escape), render_tail(state.agent_id, player_input, escape))
    always = (cfg.always_include_canonical_facts, cfg.always_include_world_state, False, False, False)
    caps = (_NO_CAP, _NO_CAP, cfg.max_beliefs, cfg.max_episodic_memories, cfg.max_dialogue_lines)
    shares = (0.0, 0.0, cfg.belief_share, cfg.episodic_share, cfg.dialogue_share)
    kept = [len(sections[i].lines) if always[i] else 0 for i in range(5)]

    mandatory_chars = len(rendering.head) + len(tail[0]) + len(tail[1])
    for i in ALWAYS:
        if always[i]:
            mandatory_chars += len(sections[i].text)
    flex_chars = cfg.max_context_chars - mandatory_chars

    count: Callable[[str], int] | None = None
    token_table: TokenSizes | None = None
    mandatory_tokens: int | None = None
    flex_tokens = 0
    if cfg.max_context_tokens is not None:
        count = token_counter(cfg.tokenizer)
        mandatory_tokens = count(_render_prompt(rendering, kept, tail)[0])
        flex_tokens = cfg.max_context_tokens - mandatory_tokens
        token_table = token_sizes(state, count, renderer)

    budgets = [(0, 0)] * 5
    over_budget = flex_chars < 0 or flex_tokens < 0
    if over_budget:
        if cfg.on_overflow == "raise":
            raise OverBudgetError(_over_budget_message(state.agent_id, cfg, mandatory_chars, mandatory_tokens))
    else:
        for i in FLEXIBLE:
            budgets[i] = (int(flex_chars * shares[i]), int(flex_tokens * shares[i]))
        _select(sections, token_table, kept, caps, always, budgets, flex_chars, flex_tokens, cfg.redistribute_unused)

    prompt, context_chars = _render_prompt(rendering, kept, tail)
    prompt_tokens: int | None = None
    if count is not None and not over_budget:
        prompt, context_chars, prompt_tokens = _fit_exact_tokens(
            rendering, kept, caps, always, tail, cfg, count, prompt, context_chars
        )
    elif count is not None:
        prompt_tokens = count(prompt)

    categories = _category_reports(sections, token_table, kept, budgets, always)
    report = TruncationReport(
        limit_chars=cfg.max_context_chars,
        limit_tokens=cfg.max_context_tokens,
        mandatory_chars=mandatory_chars,
        mandatory_tokens=mandatory_tokens,
        prompt_chars=len(prompt),
        prompt_tokens=prompt_tokens,
        over_budget=over_budget,
        canonical_facts=categories[FACTS],
        world_state=categories[WORLD],
        dialogue=categories[DIALOGUE],
        episodic=categories[EPISODIC],
        beliefs=categories[BELIEFS],
    )
    return WorkingMemory(
        agent_id=state.agent_id,
        player_input=player_input,
        prompt=prompt,
        context_chars=context_chars,
        canonical_facts=_newest(state.canonical_facts, kept[FACTS]),
        world_state=_newest(state.world_state, kept[WORLD]),
        dialogue=_newest(state.dialogue, kept[DIALOGUE]),
        episodic=_newest(state.episodic, kept[EPISODIC]),
        beliefs=_newest(state.beliefs, kept[BELIEFS]),
        report=report,
        prohibition=prohibition,
        renderer=renderer,
        system_chars=len(rendering.head) + categories[FACTS].used if renderer >= 3 else 0,
    )


def _select(
    sections: tuple[Section, ...],
    token_table: TokenSizes | None,
    kept: list[int],
    caps: tuple[int, ...],
    always: tuple[bool, ...],
    budgets: list[tuple[int, int]],
    flex_chars: int,
    flex_tokens: int,
    redistribute: bool,
) -> None:
    """Fill `kept`: the fixed split first, then redistribution, then truncatable facts."""
    if token_table is None:
        # Fast path: a category whose whole capped run fits its share (fixed split), or
        # when all of them together fit the flexible budget (redistribution), keeps
        # exactly that run; no search is needed.
        full = [0, 0, 0, 0, 0]
        total = 0
        fits_share = True
        for i in FLEXIBLE:
            section = sections[i]
            k = min(caps[i], len(section.lines))
            cost = len(section.header) + section.newest_sums[k] if k else 0
            full[i] = k
            total += cost
            fits_share = fits_share and cost <= budgets[i][0]
        truncatable_empty = all(always[i] or not sections[i].lines for i in ALWAYS)
        if truncatable_empty and (fits_share or (redistribute and total <= flex_chars)):
            for i in FLEXIBLE:
                kept[i] = full[i]
            return

    def grow(i: int, room: int, token_room: int) -> tuple[int, int]:
        section = sections[i]
        token_sums: tuple[int, ...] | None = None
        token_header = 0
        if token_table is not None:
            token_sums, token_header = token_table.newest_sums[i], token_table.headers[i]
        kept[i], room, token_room = _grow(
            section.newest_sums, len(section.header), kept[i], caps[i], room, token_sums, token_header, token_room
        )
        return room, token_room

    used_chars = used_tokens = 0
    for i in FLEXIBLE:
        budget_chars, budget_tokens = budgets[i]
        room, token_room = grow(i, budget_chars, budget_tokens)
        used_chars += budget_chars - room
        used_tokens += budget_tokens - token_room
    room, token_room = flex_chars - used_chars, flex_tokens - used_tokens
    if redistribute:
        for i in FLEXIBLE:
            room, token_room = grow(i, room, token_room)
    for i in ALWAYS:
        if not always[i]:
            budgets[i] = (room, token_room)
            room, token_room = grow(i, room, token_room)


def _fit_exact_tokens(
    rendering: RenderedState,
    kept: list[int],
    caps: tuple[int, ...],
    always: tuple[bool, ...],
    tail: tuple[str, str],
    cfg: WorkingMemoryConfig,
    count: Callable[[str], int],
    prompt: str,
    context_chars: int,
) -> tuple[str, int, int]:
    """Count the whole prompt once more, since tokens merge across item boundaries.

    Over the limit: drop the oldest kept item of the least important category until it
    fits. Then, with redistribution, offer each category its next item once more, counted
    exactly, so that the result is maximal in real tokens, not only in per-item counts.
    """
    assert cfg.max_context_tokens is not None
    limit = cfg.max_context_tokens
    tokens = count(prompt)
    truncatable = [i for i in TRIM_ORDER if not always[i]]
    while tokens > limit:
        victim = next((i for i in truncatable if kept[i] > 0), None)
        if victim is None:
            break
        kept[victim] -= 1
        prompt, context_chars = _render_prompt(rendering, kept, tail)
        tokens = count(prompt)
    if cfg.redistribute_unused:
        order = [*FLEXIBLE, *(i for i in ALWAYS if not always[i])]
        grown = True
        while grown:
            grown = False
            for i in order:
                if kept[i] >= min(caps[i], len(rendering.sections[i].lines)):
                    continue
                kept[i] += 1
                candidate, candidate_context = _render_prompt(rendering, kept, tail)
                if len(candidate) <= cfg.max_context_chars:
                    candidate_tokens = count(candidate)
                    if candidate_tokens <= limit:
                        prompt, context_chars, tokens = candidate, candidate_context, candidate_tokens
                        grown = True
                        continue
                kept[i] -= 1
    return prompt, context_chars, tokens


def _newest(items: tuple[Any, ...], k: int) -> tuple[Any, ...]:
    return items[len(items) - k :] if k else ()


def _category_reports(
    sections: tuple[Section, ...],
    token_table: TokenSizes | None,
    kept: list[int],
    budgets: list[tuple[int, int]],
    always: tuple[bool, ...],
) -> list[CategoryReport]:
    reports = []
    for i, section in enumerate(sections):
        k = kept[i]
        used = (len(section.header) + section.newest_sums[k]) if k else 0
        if token_table is None:
            reports.append(
                CategoryReport(budget=used if always[i] else budgets[i][0], used=used, kept=k,
                               dropped=len(section.lines) - k)
            )
            continue
        used_tokens = (token_table.headers[i] + token_table.newest_sums[i][k]) if k else 0
        reports.append(
            CategoryReport(
                budget=used if always[i] else budgets[i][0],
                used=used,
                kept=k,
                dropped=len(section.lines) - k,
                budget_tokens=used_tokens if always[i] else budgets[i][1],
                used_tokens=used_tokens,
            )
        )
    return reports


def _over_budget_message(
    agent_id: str, cfg: WorkingMemoryConfig, mandatory_chars: int, mandatory_tokens: int | None
) -> str:
    parts = [f"{mandatory_chars} characters against max_context_chars={cfg.max_context_chars}"]
    if mandatory_tokens is not None:
        parts.append(f"{mandatory_tokens} tokens against max_context_tokens={cfg.max_context_tokens}")
    return (
        f"working memory for agent {agent_id!r}: the mandatory content (system prompt, input, "
        f"canonical facts, world state, a retry's rule) alone is {' and '.join(parts)}; on_overflow='raise'"
    )
