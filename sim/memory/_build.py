"""Building an ephemeral working memory with priority truncation (docs/architecture.md).

`build_working_memory` is a pure function: same state, input and config give the same
bytes. Sizes are exact because the prompt is a concatenation of pieces whose sizes the
rendering computed once per state (see `sim.memory.render.rendered`); what each category
keeps is chosen in `sim.memory._selection`, in the order of the config's selection: newest
first, or `sim.memory._scoring`'s ranking. The dialogue is chosen first, and the memories
among those its kept lines do not say already (`sim.memory._duplicates`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from sim.errors import ConfigError, OverBudgetError
from sim.memory._budget import Selection, WorkingMemoryConfig
from sim.memory._duplicates import carried
from sim.memory._scoring import capped_ranking
from sim.memory._selection import (
    BELIEFS,
    DIALOGUE,
    EPISODIC,
    NO_CAP,
    Category,
    Duplicates,
    Frame,
    fit_exact_tokens,
    select,
)
from sim.memory._stable import stabilise
from sim.memory._state import Belief, Episode, Fact, Line, NpcState, WorldFact
from sim.memory._tokens import KnownCounts, TokenCounter, token_counter
from sim.memory.render import RENDERER_VERSION, render_rule, render_tail, rendered, token_sizes

__all__ = ["CategoryReport", "TruncationReport", "WorkingMemory", "build_working_memory"]


class CategoryReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one category was given and what it kept; sizes in characters (and tokens).

    `dropped` counts the items truncation left out (cap, budget, over budget, stable prefix);
    `duplicate` the memories left out because a line the dialogue keeps says them already
    (`sim.memory._duplicates`): kept + dropped + duplicate is the state's count, and a memory
    whose line is not kept is never a duplicate.

    `budget` is the category's share of the flexible budget (for a truncatable
    always-include category: what was left); `used` may exceed it when unused budget
    was redistributed.
    """

    budget: int
    used: int
    kept: int
    dropped: int
    duplicate: int = 0
    budget_tokens: int | None = None
    used_tokens: int | None = None


class TruncationReport(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the budget did to one working memory; `selection` names how the flexible
    categories chose (left out of the encoding when it is the default, "recency").

    `stable_cost_chars` is what `stable_prefix` cost: the characters of the items the
    ordinary selection kept and the stable start gave up (counted in their categories'
    `dropped`; left out of the encoding when 0).
    """

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
    selection: Selection = "recency"
    stable_cost_chars: int = 0


class WorkingMemory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One inference's context. Kept items are the state's own items, oldest first.

    `prohibition` is a retry's rule (mandatory content, rendered in the prompt).
    `renderer` names the rendering that made the prompt (`RENDERER_VERSION`); it is part
    of the encoding an audit record's digest covers. `prompt[:system_chars]` is the
    author's text: the system prompt and the canonical facts.
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
    renderer: int
    system_chars: int

    def messages(self) -> list[dict[str, str]]:
        """The same content in chat form: a system message and a user message.

        The system message is the author's text only (the system prompt and the canonical
        facts); everything that carries outside words (world state, which the game system
        changes over MQTT, beliefs, memories, dialogue, a retry's rule and the input) is
        the user message, the prompt's text up to its closing cue.
        """
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


def build_working_memory(
    state: NpcState,
    player_input: str,
    config: WorkingMemoryConfig | None = None,
    *,
    prohibition: str | None = None,
    counts: TokenCounter | Mapping[str, int] | None = None,
) -> WorkingMemory:
    """Build a fresh, immutable working memory for one inference.

    `prohibition` makes it a retry's memory: the rule is mandatory content inside the same
    budget, so flexible items make room for it.

    `counts` is what a token budget is counted with: a counting function, or the counts
    of the texts (text -> tokens; a server tokenizer's, fetched before the build), or None
    for the config's tokenizer read from its package or file. Counts that lack a text the
    build needs raise `CountsMissing` naming every such text it met.
    """
    cfg = _DEFAULT_CONFIG if config is None else config
    if cfg.max_context_tokens is None:
        return _build(state, player_input, cfg, prohibition, None)
    if counts is None:
        return _build(state, player_input, cfg, prohibition, token_counter(cfg.tokenizer))
    count = counts if callable(counts) else KnownCounts(counts)
    return _build(state, player_input, cfg, prohibition, count)


def _build(
    state: NpcState,
    player_input: str,
    cfg: WorkingMemoryConfig,
    prohibition: str | None,
    count: TokenCounter | None,
) -> WorkingMemory:
    ranks = capped_ranking(state, player_input, cfg) if cfg.selection == "scored" else {}
    lines = carried(state)
    rendering = rendered(state)
    frame = Frame(rendering.head, render_rule(prohibition), render_tail(state.agent_id, player_input))
    in_facts, in_world, in_beliefs, in_episodic, in_dialogue = rendering.sections
    always_facts, always_world = cfg.always_include_canonical_facts, cfg.always_include_world_state
    facts = Category(in_facts, NO_CAP, always_facts, in_facts.newest_sums,
                     kept=len(in_facts.lines) if always_facts else 0)
    world = Category(in_world, NO_CAP, always_world, in_world.newest_sums,
                     kept=len(in_world.lines) if always_world else 0)
    beliefs = Category(in_beliefs, cfg.max_beliefs, False, in_beliefs.newest_sums)
    episodic = Category(in_episodic, cfg.max_episodic_memories, False, in_episodic.newest_sums)
    dialogue = Category(in_dialogue, cfg.max_dialogue_lines, False, in_dialogue.newest_sums)
    categories = [facts, world, beliefs, episodic, dialogue]  # the prompt's order (RENDER_ORDER)

    mandatory_chars = len(frame.head) + len(frame.rule) + len(frame.closing)
    if always_facts:
        mandatory_chars += len(in_facts.text)
    if always_world:
        mandatory_chars += len(in_world.text)
    flex_chars = cfg.max_context_chars - mandatory_chars

    mandatory_tokens: int | None = None
    flex_tokens = 0
    if count is not None and cfg.max_context_tokens is not None:
        mandatory_tokens = count(frame.prompt(categories)[0])
        flex_tokens = cfg.max_context_tokens - mandatory_tokens
        known = count if isinstance(count, KnownCounts) else None
        sizes = token_sizes(state, count, keep=known is None)  # counts handed in are one build's
        for category, sums, header in zip(categories, sizes.newest_sums, sizes.headers, strict=True):
            category.token_sums = category.newest_token_sums = sums
            category.token_header = header
        if known is not None:
            known.check()  # every item's count at once; the whole prompts' come one by one

    over_budget = flex_chars < 0 or flex_tokens < 0
    duplicates: Duplicates | None = None
    if over_budget:
        if cfg.on_overflow == "raise":
            raise OverBudgetError(_over_budget_message(state.agent_id, cfg, mandatory_chars, mandatory_tokens))
    else:
        if ranks:
            beliefs.order_by(ranks["beliefs"])
            episodic.order_by(ranks["episodic"])
            dialogue.order_by(ranks["dialogue"])
        if lines is not None:
            duplicates = Duplicates(dialogue, episodic, lines, ranks["episodic"] if ranks else lines.newest_first)
        beliefs.budget = (int(flex_chars * cfg.belief_share), int(flex_tokens * cfg.belief_share))
        episodic.budget = (int(flex_chars * cfg.episodic_share), int(flex_tokens * cfg.episodic_share))
        dialogue.budget = (int(flex_chars * cfg.dialogue_share), int(flex_tokens * cfg.dialogue_share))
        select(categories, (flex_chars, flex_tokens), cfg.redistribute_unused, duplicates)

    prompt, context_chars = frame.prompt(categories)
    prompt_tokens: int | None = None
    if count is not None and not over_budget:
        prompt, context_chars, prompt_tokens = fit_exact_tokens(frame, categories, cfg, count, (prompt, context_chars),
                                                                duplicates)
    elif count is not None:
        prompt_tokens = count(prompt)
    stable_cost = 0
    if cfg.stable_prefix and not over_budget:
        ordinary = len(prompt)
        items: dict[int, tuple[Episode | Belief | Line, ...]] = {
            BELIEFS: state.beliefs, EPISODIC: state.episodic, DIALOGUE: state.dialogue
        }
        left_out = duplicates.left_out if duplicates is not None else frozenset()
        prompt, context_chars, prompt_tokens = stabilise(
            frame, categories, items, count, cfg.max_context_tokens, (prompt, context_chars, prompt_tokens), left_out
        )
        stable_cost = ordinary - len(prompt)

    facts_report = _category_report(facts)
    # the memories the kept lines say; those of lines `stable_prefix` gave up went with them (dropped)
    duplicate = len(duplicates.said()) if duplicates is not None else 0
    report = TruncationReport(
        limit_chars=cfg.max_context_chars,
        limit_tokens=cfg.max_context_tokens,
        mandatory_chars=mandatory_chars,
        mandatory_tokens=mandatory_tokens,
        prompt_chars=len(prompt),
        prompt_tokens=prompt_tokens,
        over_budget=over_budget,
        canonical_facts=facts_report,
        world_state=_category_report(world),
        dialogue=_category_report(dialogue),
        episodic=_category_report(episodic, duplicate),
        beliefs=_category_report(beliefs),
        selection=cfg.selection,
        stable_cost_chars=stable_cost,
    )
    return WorkingMemory(
        agent_id=state.agent_id,
        player_input=player_input,
        prompt=prompt,
        context_chars=context_chars,
        canonical_facts=_kept(state.canonical_facts, facts),
        world_state=_kept(state.world_state, world),
        dialogue=_kept(state.dialogue, dialogue),
        episodic=_kept(state.episodic, episodic),
        beliefs=_kept(state.beliefs, beliefs),
        report=report,
        prohibition=prohibition,
        renderer=RENDERER_VERSION,
        system_chars=len(rendering.head) + facts_report.used,
    )


def _kept(items: tuple[Any, ...], category: Category) -> tuple[Any, ...]:
    """The kept items, oldest first."""
    k = category.kept
    if category.rank is not None:
        return tuple([items[p] for p in category.kept_positions()])
    return items[len(items) - k :] if k else ()


def _category_report(category: Category, duplicate: int = 0) -> CategoryReport:
    section, k = category.section, category.kept
    used = (len(section.header) + category.sums[k]) if k else 0
    budget = used if category.always else category.budget[0]
    dropped = len(section.lines) - k - duplicate
    if category.token_sums is None:
        return CategoryReport(budget=budget, used=used, kept=k, dropped=dropped, duplicate=duplicate)
    used_tokens = (category.token_header + category.token_sums[k]) if k else 0
    return CategoryReport(
        budget=budget,
        used=used,
        kept=k,
        dropped=dropped,
        duplicate=duplicate,
        budget_tokens=used_tokens if category.always else category.budget[1],
        used_tokens=used_tokens,
    )


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
