"""The prompt's text format: one function per piece, used by the builder and the checker.

The prompt is, in this order (static parts first, so model servers can reuse a cached
prefix):

    {system prompt}
    <blank line>## Canonical facts      - {text}
    <blank line>## World state          - {key}: {value}
    <blank line>## Beliefs              - {text}
    <blank line>## Memories             - [tick {tick}] {text}
    <blank line>## Recent dialogue      {speaker}: {text}
    <blank line>## Rule                 {prohibition}     (a retry only)
    <blank line>## Now                  {player input}
    {agent id}:

A section's header is rendered only when the section keeps at least one item, so the first
item kept in a section costs its header too. Every size here is exact: the prompt is the
concatenation of these pieces and nothing else.

Untrusted text (docs/working-memory.md, "Untrusted text is inert"): every item's text
(canonical facts, which a game adds at run time, world state, beliefs, memories, dialogue,
the player input, the retry's prohibition) goes through `inert`, so it can neither break a
line, start a section nor carry a chat-template marker; an author's plain one-line text
comes out unchanged. The author's system prompt and the agent id are rendered verbatim.
There is one rendering, `RENDERER_VERSION` (5: markers neutralised by their shape,
zero-width and bidi controls removed, canonical facts inert too; in the chat form, the
system message holds only the system prompt and the canonical facts,
`WorkingMemory.messages`; a memory that a line of the dialogue says already is not
rendered, `sim.memory._duplicates`). Audit records name
it, and one made by another rendering is refused on replay (sim.audit), never rendered
another way.

Each state is rendered once and the rendering kept on the state object (`rendered`,
`token_sizes`), so that building a working memory costs what it keeps, not the length of
the history; msgspec neither encodes nor compares that cache.

A public module rather than more names in `sim.memory`: the prompt's format piece by piece
is needed by whoever re-renders or measures a prompt on its own (the checker, tests,
benchmarks), not by users of the builder.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from sim.text import CONTROLS, LINE_BREAKS, remove_invisible

if TYPE_CHECKING:
    from sim.memory._state import Belief, Episode, Fact, Line, NpcState, WorldFact

__all__ = [
    "CATEGORY_HEADERS",
    "LOG_HEADER",
    "RECALLED_HEADER",
    "RENDER",
    "RENDERER_VERSION",
    "RENDER_ORDER",
    "RULE_HEADER",
    "TAIL_HEADER",
    "RenderedState",
    "Section",
    "TokenSizes",
    "inert",
    "render_belief",
    "render_episode",
    "render_fact",
    "render_head",
    "render_line",
    "render_rule",
    "render_tail",
    "render_world",
    "rendered",
    "token_sizes",
]

CATEGORY_HEADERS: dict[str, str] = {
    "canonical_facts": "\n## Canonical facts\n",
    "world_state": "\n## World state\n",
    "beliefs": "\n## Beliefs\n",
    "episodic": "\n## Memories\n",
    "dialogue": "\n## Recent dialogue\n",
}
RULE_HEADER = "\n## Rule\n"
# The log layout's (`layout = "log"`): the memories and lines of one log, by tick, and the
# memories a scored selection brings back from before it.
LOG_HEADER = "\n## Log\n"
RECALLED_HEADER = "\n## Recalled\n"
TAIL_HEADER = "\n## Now\n"
# The order of the sections in the prompt: static first, the most changing last.
RENDER_ORDER = ("canonical_facts", "world_state", "beliefs", "episodic", "dialogue")

RENDERER_VERSION = 5
"""The rendering of this npcsim; audit records name the one that made them."""

# Line breaks of every kind (str.splitlines' set) become a visible "\n"; other control
# characters a space.
_BREAKS = re.compile(f"\r\n|[{LINE_BREAKS}]")
_CONTROLS = re.compile(f"(?![{LINE_BREAKS}])[{CONTROLS}]")
# Chat-template markers, by shape, whatever the family: the ends of any <|...|> and of its
# forms with the full-width bar U+FF5C (DeepSeek's User and end-of-sentence markers) or
# full-width angle brackets; <<SYS>>-style words; bracketed upper-case control words
# ([INST], [TOOL_CALLS], [SYSTEM_PROMPT], GLM's [gMASK]; and [inst], [sys] in any case);
# tags with or without attributes (<think>, </think>, <tool_call>, <s>, <sop>,
# <start_of_turn>).
_MARKERS = re.compile(
    r"[<\uff1c][|\uff5c]|[|\uff5c][>\uff1e]"
    r"|<</?[A-Za-z_]+>>"
    r"|\[/?[A-Za-z]?[A-Z][A-Z0-9_]*\]|\[/?(?i:inst|sys)\]"
    r"|</?[A-Za-z_][\w.:\u2581-]*(?:\s[^<>]*)?/?>"
)
_NEUTRAL = str.maketrans({"<": "\u2039", ">": "\u203a", "[": "\u27e6", "]": "\u27e7", "\uff1c": "\u2039",
                          "\uff1e": "\u203a"})


def _neutralise(match: re.Match[str]) -> str:
    return match.group().translate(_NEUTRAL)


def _inert(text: str) -> str:
    text = _CONTROLS.sub(" ", _BREAKS.sub("\\\\n", text))
    previous = None
    while previous != text:  # "<|>" hides a second marker behind the first: repeat until none is left
        previous, text = text, _MARKERS.sub(_neutralise, text)
    if text.lstrip().startswith("#"):
        text = "\\" + text
    return text


# Escapes remembered: an episode heard by many NPCs recurs in many states, so a pass over a
# run's records (replay, what-if) renders the same texts again and again. Only short texts
# are kept, so the cache stays bounded (about 100 MB at worst, a few MB in practice) in a long run.
_INERT_CACHE = 1 << 16
_CACHED_CHARS = 512


def _escape(text: str) -> str:
    if text.isascii() and text.isprintable() and "<" not in text and "[" not in text and "|" not in text:
        # nothing to remove or escape: no invisible mark (none is ASCII), no break or control
        # (none is printable), no marker (each begins with one of those three characters)
        return "\\" + text if text.lstrip().startswith("#") else text
    return _inert(remove_invisible(text))


_cached = functools.lru_cache(maxsize=_INERT_CACHE)(_escape)


def inert(text: str) -> str:
    """Untrusted text as data: one line, no leading "#", no chat-template marker.

    Zero-width and bidi controls go first, so that none can split a marker from the filter.
    """
    return _cached(text) if len(text) <= _CACHED_CHARS else _escape(text)


def render_head(system_prompt: str) -> str:
    return f"{system_prompt}\n"


def render_fact(f: Fact) -> str:
    return f"- {inert(f.text)}\n"  # a game adds facts at run time: its text is outside text too


def render_world(w: WorldFact) -> str:
    return f"- {inert(w.key)}: {inert(w.value)}\n"


def render_belief(b: Belief) -> str:
    return f"- {inert(b.text)}\n"


def render_episode(e: Episode) -> str:
    return f"- [tick {e.tick}] {inert(e.text)}\n"


def render_line(line: Line) -> str:
    return f"{inert(line.speaker)}: {inert(line.text)}\n"


def render_rule(prohibition: str | None) -> str:
    """A retry's prohibition, as its own section at the end of the context; "" otherwise."""
    return f"{RULE_HEADER}{inert(prohibition)}\n" if prohibition is not None else ""


RENDER: dict[str, Callable[..., str]] = {
    "canonical_facts": render_fact,
    "world_state": render_world,
    "beliefs": render_belief,
    "episodic": render_episode,
    "dialogue": render_line,
}


def render_tail(agent_id: str, player_input: str) -> str:
    """The closing piece: what was just said to the NPC, then its cue to answer."""
    said = f"{inert(player_input)}\n" if player_input else ""
    return f"{TAIL_HEADER}{said}{agent_id}:"


class Section(msgspec.Struct, frozen=True):
    """One category's rendered items, oldest first, and their sizes in characters.

    `newest_sums[k]` is the size of the k newest lines together, so that the largest run
    fitting a budget is one bisection instead of a loop.
    """

    header: str
    lines: tuple[str, ...]
    newest_sums: tuple[int, ...]
    text: str  # header + every line: the section as rendered when nothing is dropped


class RenderedState(msgspec.Struct, frozen=True):
    head: str
    sections: tuple[Section, ...]  # in RENDER_ORDER


class TokenSizes(msgspec.Struct, frozen=True):
    """Per-item token counts of a rendered state, per section in RENDER_ORDER."""

    newest_sums: tuple[tuple[int, ...], ...]
    headers: tuple[int, ...]


def _newest_sums(sizes: Sequence[int]) -> tuple[int, ...]:
    """Running totals of sizes taken newest first: entry k is the size of the k newest."""
    return (0, *itertools.accumulate(reversed(sizes)))


def _section(name: str, lines: Sequence[str]) -> Section:
    header = CATEGORY_HEADERS[name]
    body = "".join(lines)
    return Section(
        header=header,
        lines=tuple(lines),
        newest_sums=_newest_sums([len(line) for line in lines]),
        text=header + body if lines else "",
    )


# Items' lines remembered, per section: the same episode, fact or line recurs in
# the states of every NPC that heard it and of every later turn, and an item is frozen, so an
# equal item renders as the same line. Past `_LINE_CACHE` items a section's cache starts over.
_LINE_CACHE = 1 << 16
_item_lines: dict[str, dict[object, str]] = {}


def _render_items(name: str, items: Sequence[object]) -> list[str]:
    cache = _item_lines.setdefault(name, {})
    render = RENDER[name]
    lines = []
    for item in items:
        line = cache.get(item)
        if line is None:
            if len(cache) >= _LINE_CACHE:
                cache.clear()
            line = cache[item] = render(item)
        lines.append(line)
    return lines


def _render_state(state: NpcState) -> RenderedState:
    return RenderedState(
        head=render_head(state.system_prompt),
        sections=tuple(_section(name, _render_items(name, getattr(state, name))) for name in RENDER_ORDER),
    )


# Keys of the caches in a state's instance `__dict__`; the names are this module's.
_RENDERED = "_npcsim_rendered"
_TOKEN_SIZES = "_npcsim_token_sizes"


def rendered(state: NpcState) -> RenderedState:
    """Every item of `state` rendered, with its size: computed once per state."""
    found: RenderedState | None = state.__dict__.get(_RENDERED)
    if found is None:
        found = state.__dict__[_RENDERED] = _render_state(state)
    return found


def token_sizes(state: NpcState, count: Callable[[str], int], *, keep: bool = True) -> TokenSizes:
    """Per-item token counts of `rendered(state)` for the counter `count`, computed once per
    state and counter (each time with `keep` false: a counter that lives for one build)."""
    cache: dict[Callable[[str], int], TokenSizes] = state.__dict__.setdefault(_TOKEN_SIZES, {})
    sizes = cache.get(count)
    if sizes is None:
        sections = rendered(state).sections
        sizes = TokenSizes(
            newest_sums=tuple(_newest_sums([count(line) for line in s.lines]) for s in sections),
            headers=tuple(count(s.header) for s in sections),
        )
        if keep:
            cache[count] = sizes
    return sizes
