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

from sim.errors import OverBudgetError
from sim.memory._budget import WorkingMemoryConfig
from sim.memory._duplicates import carried
from sim.memory._log import build_log
from sim.memory._scoring import capped_ranking
from sim.memory._selection import (
    BELIEFS,
    DIALOGUE,
    EPISODIC,
    Category,
    Duplicates,
    Frame,
    fit_exact_tokens,
    leading_categories,
    select,
)
from sim.memory._snapshot import (
    CategoryReport,
    TruncationReport,
    WorkingMemory,
    category_report,
    kept_items,
    over_budget_message,
)
from sim.memory._stable import stabilise
from sim.memory._state import Belief, Episode, Line, NpcState
from sim.memory._tokens import KnownCounts, TokenCounter, token_counter
from sim.memory.render import RENDERER_VERSION, render_rule, render_tail, rendered, token_sizes

__all__ = ["CategoryReport", "TruncationReport", "WorkingMemory", "build_working_memory"]


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
    build = build_log if cfg.layout == "log" else _build
    return build(state, player_input, cfg, prohibition, counter_for(cfg, counts))


def counter_for(cfg: WorkingMemoryConfig, counts: TokenCounter | Mapping[str, int] | None) -> TokenCounter | None:
    """What a build counts tokens with (`build_working_memory`'s `counts`); None without a token limit."""
    if cfg.max_context_tokens is None:
        return None
    if counts is None:
        return token_counter(cfg.tokenizer)
    return counts if callable(counts) else KnownCounts(counts)


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
    in_episodic, in_dialogue = rendering.sections[EPISODIC], rendering.sections[DIALOGUE]
    facts, world, beliefs = leading_categories(rendering.sections, cfg)
    always_facts, always_world = facts.always, world.always
    episodic = Category(in_episodic, cfg.max_episodic_memories, False, in_episodic.newest_sums)
    dialogue = Category(in_dialogue, cfg.max_dialogue_lines, False, in_dialogue.newest_sums)
    categories = [facts, world, beliefs, episodic, dialogue]  # the prompt's order (RENDER_ORDER)

    mandatory_chars = len(frame.head) + len(frame.rule) + len(frame.closing)
    if always_facts:
        mandatory_chars += len(facts.section.text)
    if always_world:
        mandatory_chars += len(world.section.text)
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
            raise OverBudgetError(over_budget_message(state.agent_id, cfg, mandatory_chars, mandatory_tokens))
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

    facts_report = category_report(facts)
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
        world_state=category_report(world),
        dialogue=category_report(dialogue),
        episodic=category_report(episodic, duplicate),
        beliefs=category_report(beliefs),
        selection=cfg.selection,
        stable_cost_chars=stable_cost,
    )
    return WorkingMemory(
        agent_id=state.agent_id,
        player_input=player_input,
        prompt=prompt,
        context_chars=context_chars,
        canonical_facts=kept_items(state.canonical_facts, facts),
        world_state=kept_items(state.world_state, world),
        dialogue=kept_items(state.dialogue, dialogue),
        episodic=kept_items(state.episodic, episodic),
        beliefs=kept_items(state.beliefs, beliefs),
        report=report,
        prohibition=prohibition,
        renderer=RENDERER_VERSION,
        system_chars=len(rendering.head) + facts_report.used,
    )


