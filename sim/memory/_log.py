"""`layout = "log"`: a prompt that a later prompt extends, so a model server's cache reuses it.

The sections layout gives each category a section, and a new item in one shifts every
section after it. The log layout orders the prompt by how often its parts change:

    {system prompt}
    ## Canonical facts, ## World state, ## Beliefs     (as in the sections layout)
    ## Log          the NPC's memories and lines of dialogue, by tick (a memory before a
                    line of the same tick), each rendered as in its section
    ## Recalled     (scored selection only) memories from before the log, best ranked first
    ## Rule         (a retry only)
    ## Now          the input, then the cue

**The log** is the newest contiguous run of the NPC's history: every line of its dialogue
and every memory whose event no line of the state records (a line says its event once; its
memory is a `duplicate` while the line is kept, and leaves with it otherwise). It keeps at
most `max_dialogue_lines` lines and `max_episodic_memories` memories, within its budget:
the dialogue's and the memories' shares together with the recency selection, the
dialogue's share with the scored one (the memories' share is then the recalled section's).
So a new turn appends to the log, and truncation drops only at its head. The head moves in
chunks: once the log no longer holds the whole history, it starts at the oldest anchor at or
after its ordinary start (an anchor is
an item whose identity hashes below 1 / K, `sim.memory._stable.is_anchor`, K =
`anchor_every` of the log's two caps together), so between two jumps every prompt extends
the one before; what a jump gives up is dropped with the reason `stable_prefix`.

**Recalled** (scored selection): the memories older than the log's ordinary start (those of
lines before it included), in the scored ranking's order, within the memories' cap (less
the log's memories) and share: the retrieved long-term items `[memory.scored] recall`
brings, and whatever older memory ranks best, last before the input.

**Beliefs, facts, world state** are chosen as in the sections layout, except that the
beliefs keep to their share: what changes slowly stays put while the log grows below it.
With `redistribute_unused`, what is left goes to the log (recency; older items, still one
run) or to the recalled section (scored), then to a truncatable always-include category.
With a token limit the whole prompt is counted once more, and over it the least important
kept item goes first (world state, facts, beliefs, the recalled, then the log's oldest)
until it fits; the log or the recalled, then a truncatable always-include category, are
then offered their next item once, counted exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from sim.errors import OverBudgetError
from sim.memory._budget import WorkingMemoryConfig
from sim.memory._log_run import LogRun, log_entries
from sim.memory._scoring import ranking
from sim.memory._selection import DIALOGUE, EPISODIC, Category, Frame, leading_categories
from sim.memory._snapshot import (
    CategoryReport,
    TruncationReport,
    WorkingMemory,
    category_report,
    kept_items,
    over_budget_message,
)
from sim.memory._stable import anchor_every, is_anchor
from sim.memory._state import NpcState
from sim.memory._tokens import KnownCounts
from sim.memory.render import (
    LOG_HEADER,
    RECALLED_HEADER,
    RENDERER_VERSION,
    RenderedState,
    Section,
    render_rule,
    render_tail,
    rendered,
    token_sizes,
)

__all__ = ["build_log"]


class _Parts(NamedTuple):
    """A build's pieces: the frame, the categories before the log, the log, the recalled."""

    frame: Frame
    before: list[Category]  # facts, world, beliefs
    log: LogRun
    recalled: Category | None  # a scored selection's


class _Sizes(NamedTuple):
    """The mandatory content's and the flexible budget's sizes (characters, tokens)."""

    mandatory_chars: int
    mandatory_tokens: int | None
    flex_chars: int
    flex_tokens: int


def _prompt(parts: _Parts) -> tuple[str, int]:
    log, recalled = parts.log, parts.recalled
    head, _ = Frame(parts.frame.head, "", "").prompt(parts.before)
    pieces = [head]
    if log.start < len(log.entries):
        pieces.append(LOG_HEADER)
        pieces.extend(log.texts[log.start :])
    if recalled is not None and recalled.kept:
        pieces.append(recalled.section.header)
        lines = recalled.section.lines
        pieces.extend([lines[p] for p in recalled.kept_positions()])
    pieces.append(parts.frame.rule)
    context = "".join(pieces)
    return context + parts.frame.closing, len(context)


def build_log(
    state: NpcState,
    player_input: str,
    cfg: WorkingMemoryConfig,
    prohibition: str | None,
    count: Callable[[str], int] | None,
    *,
    chunked: bool = True,
) -> WorkingMemory:
    """The working memory of `state` in the log layout (the module's docstring); `chunked`
    False gives the ordinary start (what the explanation compares with)."""
    rendering = rendered(state)
    in_episodic, in_dialogue = rendering.sections[EPISODIC], rendering.sections[DIALOGUE]
    facts, world, beliefs = leading_categories(rendering.sections, cfg)
    entries = log_entries(state)
    texts = [in_dialogue.lines[e.position] if e.line else in_episodic.lines[e.position] for e in entries]
    recalled = Category(Section(RECALLED_HEADER, in_episodic.lines, in_episodic.newest_sums, ""), 0, False,
                        in_episodic.newest_sums) if cfg.selection == "scored" else None
    parts = _Parts(Frame(rendering.head, render_rule(prohibition), render_tail(state.agent_id, player_input)),
                   [facts, world, beliefs],
                   LogRun(entries, texts, None, 0, (cfg.max_dialogue_lines, cfg.max_episodic_memories)), recalled)

    mandatory = _prompt(parts)[0]  # nothing flexible is kept yet
    flex_chars = cfg.max_context_chars - len(mandatory)
    mandatory_tokens: int | None = None
    flex_tokens = 0
    if count is not None and cfg.max_context_tokens is not None:
        mandatory_tokens = count(mandatory)
        flex_tokens = cfg.max_context_tokens - mandatory_tokens
        _count_items(state, rendering, count, parts)
    sizes = _Sizes(len(mandatory), mandatory_tokens, flex_chars, flex_tokens)
    over_budget = flex_chars < 0 or flex_tokens < 0
    if over_budget:
        if cfg.on_overflow == "raise":
            raise OverBudgetError(over_budget_message(state.agent_id, cfg, len(mandatory), mandatory_tokens))
    else:
        _select(state, player_input, cfg, sizes, parts)
    prompt, context_chars = _prompt(parts)
    prompt_tokens: int | None = None
    if count is not None and cfg.max_context_tokens is not None and not over_budget:
        prompt, context_chars, prompt_tokens = _fit_tokens(cfg, count, parts, prompt, context_chars)
    elif count is not None:
        prompt_tokens = count(prompt)
    chunk_cost = 0
    if chunked and not over_budget:
        ordinary = len(prompt)
        prompt, context_chars, prompt_tokens = _chunk(cfg, count, parts, (prompt, context_chars, prompt_tokens))
        chunk_cost = ordinary - len(prompt)
    return _memory(state, player_input, cfg, prohibition, parts, (prompt, context_chars, prompt_tokens), sizes,
                   chunk_cost)


def _count_items(state: NpcState, rendering: RenderedState, count: Callable[[str], int], parts: _Parts) -> None:
    """Per-item token counts, from the sections' (the same texts), and the log's header."""
    before, log, recalled = parts.before, parts.log, parts.recalled
    known = count if isinstance(count, KnownCounts) else None
    sizes = token_sizes(state, count, keep=known is None)
    for category, sums, header in zip(before, sizes.newest_sums, sizes.headers, strict=False):
        category.token_sums = category.newest_token_sums = sums
        category.token_header = header
    episodic_sums, dialogue_sums = sizes.newest_sums[3], sizes.newest_sums[4]
    if recalled is not None:
        recalled.token_sums = recalled.newest_token_sums = episodic_sums
        recalled.token_header = count(RECALLED_HEADER)

    def one(sums: tuple[int, ...], position: int) -> int:
        n = len(sums) - 1  # the item at position p is the (n - p)-th newest
        return sums[n - position] - sums[n - position - 1]

    log.tokens = [one(dialogue_sums if e.line else episodic_sums, e.position) for e in log.entries]
    log.header_tokens = count(LOG_HEADER)
    if known is not None:
        known.check()


def _select(state: NpcState, player_input: str, cfg: WorkingMemoryConfig, sizes: _Sizes, parts: _Parts) -> None:
    """The fixed split, then what is left to the log (or the recalled), then to a truncatable
    always-include category."""
    flex_chars, flex_tokens, log, recalled = sizes.flex_chars, sizes.flex_tokens, parts.log, parts.recalled
    facts, world, beliefs = parts.before
    log_share = cfg.dialogue_share + (0.0 if recalled is not None else cfg.episodic_share)
    used_chars = used_tokens = 0
    budget = (int(flex_chars * log_share), int(flex_tokens * log_share))
    room = log.grow(*budget)
    used_chars, used_tokens = budget[0] - room[0], budget[1] - room[1]
    ranks = ranking(state, player_input, cfg) if recalled is not None else {}
    if ranks:
        beliefs.order_by(ranks["beliefs"])
    beliefs.budget = (int(flex_chars * cfg.belief_share), int(flex_tokens * cfg.belief_share))
    room = beliefs.grow(*beliefs.budget)
    used_chars += beliefs.budget[0] - room[0]
    used_tokens += beliefs.budget[1] - room[1]
    if recalled is not None:
        recalled.cap = max(cfg.max_episodic_memories - log.memories, 0)  # before the order: it reads the cap
        recalled.order_by(_before_log(state, log, ranks["episodic"]))
        recalled.budget = (int(flex_chars * cfg.episodic_share), int(flex_tokens * cfg.episodic_share))
        room = recalled.grow(*recalled.budget)
        used_chars += recalled.budget[0] - room[0]
        used_tokens += recalled.budget[1] - room[1]
    room = (flex_chars - used_chars, flex_tokens - used_tokens)
    if cfg.redistribute_unused:
        room = recalled.grow(*room) if recalled is not None else log.grow(*room)
    for category in (facts, world):
        if not category.always:
            category.budget = room
            room = category.grow(*room)


def _before_log(state: NpcState, log: LogRun, order: tuple[int, ...]) -> tuple[int, ...]:
    """The memories of `order` older than the log's start whose event no kept line records."""
    start = log.entries[log.start].key if log.start < len(log.entries) else None
    said = {e.item.event for e in log.kept() if e.line} - {None}
    episodic = state.episodic
    return tuple([q for q in order
                  if (start is None or (episodic[q].tick, 0, q) < start) and episodic[q].event not in said])


def _fit_tokens(cfg: WorkingMemoryConfig, count: Callable[[str], int], parts: _Parts, prompt: str,
                context_chars: int) -> tuple[str, int, int]:
    """Count the whole prompt: over the limit, the least important kept item goes first until
    it fits; then, with redistribution, each is offered its next item once, counted exactly."""
    assert cfg.max_context_tokens is not None
    limit = cfg.max_context_tokens
    facts, world, beliefs = parts.before
    log, recalled = parts.log, parts.recalled
    tokens = count(prompt)
    trim = [c for c in (world, facts, beliefs, recalled) if c is not None and not c.always]
    while tokens > limit:
        victim = next((c for c in trim if c.kept > 0), None)
        if victim is not None:
            victim.kept -= 1
        elif log.start < len(log.entries):
            log.drop_oldest()
        else:
            break
        prompt, context_chars = _prompt(parts)
        tokens = count(prompt)
    if not cfg.redistribute_unused:
        return prompt, context_chars, tokens
    grown = True
    while grown:
        grown = False
        if recalled is None and log.start > 0:
            start = log.start
            entry = log.entries[start - 1]
            if (log.lines if entry.line else log.memories) < log.caps[0 if entry.line else 1]:
                log.restart(start - 1)
                candidate, candidate_context = _prompt(parts)
                if len(candidate) <= cfg.max_context_chars and (n := count(candidate)) <= limit:
                    prompt, context_chars, tokens, grown = candidate, candidate_context, n, True
                else:
                    log.restart(start)
        for category in (recalled, facts, world):
            if category is None or category.always or category.keeps_all_it_may():
                continue
            category.kept += 1
            candidate, candidate_context = _prompt(parts)
            if len(candidate) <= cfg.max_context_chars and (n := count(candidate)) <= limit:
                prompt, context_chars, tokens, grown = candidate, candidate_context, n, True
            else:
                category.kept -= 1
    return prompt, context_chars, tokens


def _chunk(cfg: WorkingMemoryConfig, count: Callable[[str], int] | None, parts: _Parts,
           fitted: tuple[str, int, int | None]) -> tuple[str, int, int | None]:
    """Move the log's start to the oldest anchor at or after it (none: it stays); a log that
    holds the whole history from its first entry grows only at its end, and stays."""
    log = parts.log
    if log.start == 0:
        return fitted
    kept = log.kept()
    every = anchor_every(cfg.max_dialogue_lines + cfg.max_episodic_memories)
    anchor = next((i for i, entry in enumerate(kept) if is_anchor(entry.item, every)), None)
    if not anchor:
        return fitted
    ordinary = log.start
    log.restart(ordinary + anchor)
    prompt, context_chars = _prompt(parts)
    if count is None:
        return prompt, context_chars, None
    tokens = count(prompt)
    if cfg.max_context_tokens is not None and tokens > cfg.max_context_tokens:  # tokens merge: keep the ordinary
        log.restart(ordinary)
        return fitted
    return prompt, context_chars, tokens


def _memory(state: NpcState, player_input: str, cfg: WorkingMemoryConfig, prohibition: str | None, parts: _Parts,
            built: tuple[str, int, int | None], sizes: _Sizes, chunk_cost: int) -> WorkingMemory:
    prompt, context_chars, prompt_tokens = built
    facts, world, beliefs = parts.before
    log, recalled = parts.log, parts.recalled
    kept = log.kept()
    lines = sorted(e.position for e in kept if e.line)
    memories = [e.position for e in kept if not e.line]
    if recalled is not None:
        memories += recalled.kept_positions()
    memories.sort()
    lines_said = {state.dialogue[p].event for p in lines} - {None}
    duplicate = sum(1 for e in state.episodic if e.event is not None and e.event in lines_said)
    line_chars, line_tokens = log.kind_size(line=True)
    memory_chars, memory_tokens = log.kind_size(line=False)
    if kept:  # the log's header is paid by its lines when it keeps one, else by its memories
        if lines:
            line_chars, line_tokens = line_chars + len(LOG_HEADER), line_tokens + log.header_tokens
        else:
            memory_chars, memory_tokens = memory_chars + len(LOG_HEADER), memory_tokens + log.header_tokens
    if recalled is not None:
        recalled_report = category_report(recalled)
        memory_chars += recalled_report.used
        memory_tokens += recalled_report.used_tokens or 0
    tokens = log.tokens is not None
    flex_chars, flex_tokens = sizes.flex_chars, sizes.flex_tokens
    dialogue_report = CategoryReport(
        budget=int(flex_chars * cfg.dialogue_share), used=line_chars, kept=len(lines),
        dropped=len(state.dialogue) - len(lines),
        budget_tokens=int(flex_tokens * cfg.dialogue_share) if tokens else None,
        used_tokens=line_tokens if tokens else None)
    episodic_report = CategoryReport(
        budget=int(flex_chars * cfg.episodic_share), used=memory_chars, kept=len(memories),
        dropped=len(state.episodic) - len(memories) - duplicate, duplicate=duplicate,
        budget_tokens=int(flex_tokens * cfg.episodic_share) if tokens else None,
        used_tokens=memory_tokens if tokens else None)
    facts_report = category_report(facts)
    report = TruncationReport(
        limit_chars=cfg.max_context_chars, limit_tokens=cfg.max_context_tokens,
        mandatory_chars=sizes.mandatory_chars, mandatory_tokens=sizes.mandatory_tokens,
        prompt_chars=len(prompt), prompt_tokens=prompt_tokens, over_budget=flex_chars < 0 or flex_tokens < 0,
        canonical_facts=facts_report, world_state=category_report(world),
        dialogue=dialogue_report, episodic=episodic_report, beliefs=category_report(beliefs),
        selection=cfg.selection, stable_cost_chars=chunk_cost,
    )
    return WorkingMemory(
        agent_id=state.agent_id, player_input=player_input, prompt=prompt, context_chars=context_chars,
        canonical_facts=kept_items(state.canonical_facts, facts), world_state=kept_items(state.world_state, world),
        dialogue=tuple([state.dialogue[p] for p in lines]), episodic=tuple([state.episodic[q] for q in memories]),
        beliefs=kept_items(state.beliefs, beliefs), report=report, prohibition=prohibition,
        renderer=RENDERER_VERSION, system_chars=len(parts.frame.head) + facts_report.used,
    )
