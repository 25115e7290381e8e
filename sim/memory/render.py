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

Untrusted text (docs/working-memory.md, "Untrusted text is inert"): everything that did
not come from the scenario's author (world state, beliefs, memories, dialogue, the player
input, the retry's prohibition) goes through `inert`, so it can neither break a line, start
a section nor carry a chat-template marker. The author's system prompt, canonical facts and
agent id are rendered verbatim. Every renderer version ever written is kept, so that audit
records written by it still replay byte for byte; `RENDERER_VERSION` is what is written now:

    1  untrusted text verbatim
    2  `inert`: line breaks and controls escaped, a list of marker families neutralised
    3  markers neutralised by their shape, zero-width and bidi controls removed; in the chat
       form, the system message holds only the author's text (`WorkingMemory.messages`)

Each state is rendered once per renderer version and the rendering kept on the state
object (`rendered`, `token_sizes`), so that building a working memory costs what it keeps,
not the length of the history; msgspec neither encodes nor compares that cache.

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

from sim.errors import ConfigError
from sim.text import CONTROLS, LINE_BREAKS, remove_invisible

if TYPE_CHECKING:
    from sim.memory._state import Belief, Episode, Fact, Line, NpcState, WorldFact

__all__ = [
    "CATEGORY_HEADERS",
    "RENDER",
    "RENDERER_VERSION",
    "RENDER_ORDER",
    "RULE_HEADER",
    "TAIL_HEADER",
    "Escape",
    "RenderedState",
    "Section",
    "TokenSizes",
    "escape_for",
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
TAIL_HEADER = "\n## Now\n"
# The order of the sections in the prompt: static first, the most changing last.
RENDER_ORDER = ("canonical_facts", "world_state", "beliefs", "episodic", "dialogue")

RENDERER_VERSION = 3
"""The rendering written now; audit records name theirs (see the versions above)."""

Escape = Callable[[str], str]

# Line breaks of every kind (str.splitlines' set) become a visible "\n"; other control
# characters a space.
_BREAKS = re.compile(f"\r\n|[{LINE_BREAKS}]")
_CONTROLS = re.compile(f"(?![{LINE_BREAKS}])[{CONTROLS}]")
# Renderer 2's markers, a list of families: every "<|" and "|>" (ChatML, Llama 3, Phi),
# [INST] and <<SYS>> (Llama 2, Mistral), <s> </s> <bos> <eos>, Gemma's turn markers.
_MARKERS_2 = re.compile(
    r"<\||\|>|\[/?INST\]|\[/?SYS\]|<</?SYS>>|</?(?:s|bos|eos|start_of_turn|end_of_turn)>", re.IGNORECASE
)
# Renderer 3's markers, by shape, whatever the family: the ends of any <|...|> and of its
# forms with the full-width bar U+FF5C (DeepSeek's User and end-of-sentence markers) or
# full-width angle brackets; <<SYS>>-style words; bracketed upper-case control words
# ([INST], [TOOL_CALLS], [SYSTEM_PROMPT], GLM's [gMASK]; and [inst], [sys], which renderer
# 2 caught in any case); tags with or without attributes (<think>, </think>, <tool_call>,
# <s>, <sop>, <start_of_turn>). Everything renderer 2 neutralised, renderer 3 does too.
_MARKERS_3 = re.compile(
    r"[<\uff1c][|\uff5c]|[|\uff5c][>\uff1e]"
    r"|<</?[A-Za-z_]+>>"
    r"|\[/?[A-Za-z]?[A-Z][A-Z0-9_]*\]|\[/?(?i:inst|sys)\]"
    r"|</?[A-Za-z_][\w.:\u2581-]*(?:\s[^<>]*)?/?>"
)
_NEUTRAL = str.maketrans({"<": "\u2039", ">": "\u203a", "[": "\u27e6", "]": "\u27e7", "\uff1c": "\u2039",
                          "\uff1e": "\u203a"})


def _neutralise(match: re.Match[str]) -> str:
    return match.group().translate(_NEUTRAL)


def _inert(text: str, markers: re.Pattern[str]) -> str:
    text = _CONTROLS.sub(" ", _BREAKS.sub("\\\\n", text))
    previous = None
    while previous != text:  # "<|>" hides a second marker behind the first: repeat until none is left
        previous, text = text, markers.sub(_neutralise, text)
    if text.lstrip().startswith("#"):
        text = "\\" + text
    return text


# Escapes remembered: an episode heard by many NPCs recurs in many states, so a pass over a
# run's records (replay, what-if) renders the same texts again and again. Only short texts
# are kept, so the cache stays bounded (about 100 MB at worst, a few MB in practice) in a long run.
_INERT_CACHE = 1 << 16
_CACHED_CHARS = 512


def _escape_3(text: str) -> str:
    if text.isascii() and text.isprintable() and "<" not in text and "[" not in text and "|" not in text:
        # nothing to remove or escape: no invisible mark (none is ASCII), no break or control
        # (none is printable), no marker (each begins with one of those three characters)
        return "\\" + text if text.lstrip().startswith("#") else text
    return _inert(remove_invisible(text), _MARKERS_3)


def _escape_2(text: str) -> str:
    return _inert(text, _MARKERS_2)


_cached_3 = functools.lru_cache(maxsize=_INERT_CACHE)(_escape_3)
_cached_2 = functools.lru_cache(maxsize=_INERT_CACHE)(_escape_2)


def inert(text: str) -> str:
    """Untrusted text as data: one line, no leading "#", no chat-template marker (renderer 3).

    Zero-width and bidi controls go first, so that none can split a marker from the filter.
    """
    return _cached_3(text) if len(text) <= _CACHED_CHARS else _escape_3(text)


def _inert_2(text: str) -> str:
    """Renderer 2's `inert`, kept as it was so that its records replay."""
    return _cached_2(text) if len(text) <= _CACHED_CHARS else _escape_2(text)


def _verbatim(text: str) -> str:
    return text


_ESCAPES: dict[int, Escape] = {1: _verbatim, 2: _inert_2, 3: inert}


def escape_for(renderer: int) -> Escape:
    """The untrusted-text escape of a renderer version; a version we never wrote is refused."""
    escape = _ESCAPES.get(renderer)
    if escape is None:
        raise ConfigError(f"renderer: unknown renderer version {renderer!r}; known: {sorted(_ESCAPES)}")
    return escape


def render_head(system_prompt: str) -> str:
    return f"{system_prompt}\n"


def render_fact(f: Fact, escape: Escape = inert) -> str:
    return f"- {f.text}\n"  # the author's text: verbatim (I1)


def render_world(w: WorldFact, escape: Escape = inert) -> str:
    return f"- {escape(w.key)}: {escape(w.value)}\n"


def render_belief(b: Belief, escape: Escape = inert) -> str:
    return f"- {escape(b.text)}\n"


def render_episode(e: Episode, escape: Escape = inert) -> str:
    return f"- [tick {e.tick}] {escape(e.text)}\n"


def render_line(line: Line, escape: Escape = inert) -> str:
    return f"{escape(line.speaker)}: {escape(line.text)}\n"


def render_rule(prohibition: str | None, escape: Escape = inert) -> str:
    """A retry's prohibition, as its own section at the end of the context; "" otherwise."""
    return f"{RULE_HEADER}{escape(prohibition)}\n" if prohibition is not None else ""


RENDER: dict[str, Callable[..., str]] = {
    "canonical_facts": render_fact,
    "world_state": render_world,
    "beliefs": render_belief,
    "episodic": render_episode,
    "dialogue": render_line,
}


def render_tail(agent_id: str, player_input: str, escape: Escape = inert) -> str:
    """The closing piece: what was just said to the NPC, then its cue to answer."""
    said = f"{escape(player_input)}\n" if player_input else ""
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


# Items' lines remembered, per renderer and section: the same episode, fact or line recurs in
# the states of every NPC that heard it and of every later turn, and an item is frozen, so an
# equal item renders as the same line. Past `_LINE_CACHE` items a section's cache starts over.
_LINE_CACHE = 1 << 16
_item_lines: dict[tuple[int, str], dict[object, str]] = {}


def _render_items(name: str, items: Sequence[object], renderer: int, escape: Escape) -> list[str]:
    cache = _item_lines.setdefault((renderer, name), {})
    render = RENDER[name]
    lines = []
    for item in items:
        line = cache.get(item)
        if line is None:
            if len(cache) >= _LINE_CACHE:
                cache.clear()
            line = cache[item] = render(item, escape)
        lines.append(line)
    return lines


def _render_state(state: NpcState, renderer: int) -> RenderedState:
    escape = escape_for(renderer)
    return RenderedState(
        head=render_head(state.system_prompt),
        sections=tuple(
            _section(name, _render_items(name, getattr(state, name), renderer, escape)) for name in RENDER_ORDER
        ),
    )


# Keys of the caches in a state's instance `__dict__`; the names are this module's.
_RENDERED = "_npcsim_rendered"
_TOKEN_SIZES = "_npcsim_token_sizes"


def rendered(state: NpcState, renderer: int = RENDERER_VERSION) -> RenderedState:
    """Every item of `state` rendered by `renderer`, with its size: computed once per state and version."""
    try:
        found: RenderedState = state.__dict__[_RENDERED][renderer]
    except KeyError:
        found = state.__dict__.setdefault(_RENDERED, {})[renderer] = _render_state(state, renderer)
    return found


def token_sizes(state: NpcState, count: Callable[[str], int], renderer: int = RENDERER_VERSION) -> TokenSizes:
    """Per-item token counts of `rendered(state, renderer)` for the counter `count`, computed once."""
    cache: dict[tuple[Callable[[str], int], int], TokenSizes] = state.__dict__.setdefault(_TOKEN_SIZES, {})
    sizes = cache.get((count, renderer))
    if sizes is None:
        sections = rendered(state, renderer).sections
        sizes = cache[(count, renderer)] = TokenSizes(
            newest_sums=tuple(_newest_sums([count(line) for line in s.lines]) for s in sections),
            headers=tuple(count(s.header) for s in sections),
        )
    return sizes
