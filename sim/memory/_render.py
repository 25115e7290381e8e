"""The prompt's text format: one function per piece, used by the builder and the checker.

The prompt is, in this order (static parts first, so model servers can reuse a cached
prefix):

    {system prompt}
    <blank line>## Canonical facts      - {text}
    <blank line>## World state          - {key}: {value}
    <blank line>## Beliefs              - {text}
    <blank line>## Memories             - [tick {tick}] {text}
    <blank line>## Recent dialogue      {speaker}: {text}
    <blank line>## Now                  {player input}
    {agent id}:

A section's header is rendered only when the section keeps at least one item, so the first
item kept in a section costs its header too. Every size here is exact: the prompt is the
concatenation of these pieces and nothing else.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from sim.memory._state import Belief, Episode, Fact, Line, NpcState, WorldFact

__all__ = [
    "CATEGORY_HEADERS",
    "RENDER",
    "RENDER_ORDER",
    "RenderedState",
    "TokenSizes",
    "render_belief",
    "render_episode",
    "render_fact",
    "render_head",
    "render_line",
    "render_state",
    "render_tail",
    "render_world",
    "newest_sums",
    "token_sizes",
]

CATEGORY_HEADERS: dict[str, str] = {
    "canonical_facts": "\n## Canonical facts\n",
    "world_state": "\n## World state\n",
    "beliefs": "\n## Beliefs\n",
    "episodic": "\n## Memories\n",
    "dialogue": "\n## Recent dialogue\n",
}
TAIL_HEADER = "\n## Now\n"
# The order of the sections in the prompt: static first, the most changing last.
RENDER_ORDER = ("canonical_facts", "world_state", "beliefs", "episodic", "dialogue")


def render_head(system_prompt: str) -> str:
    return f"{system_prompt}\n"


def render_fact(f: Fact) -> str:
    return f"- {f.text}\n"


def render_world(w: WorldFact) -> str:
    return f"- {w.key}: {w.value}\n"


def render_belief(b: Belief) -> str:
    return f"- {b.text}\n"


def render_episode(e: Episode) -> str:
    return f"- [tick {e.tick}] {e.text}\n"


def render_line(line: Line) -> str:
    return f"{line.speaker}: {line.text}\n"


RENDER: dict[str, Callable[[Any], str]] = {
    "canonical_facts": render_fact,
    "world_state": render_world,
    "beliefs": render_belief,
    "episodic": render_episode,
    "dialogue": render_line,
}


def render_tail(agent_id: str, player_input: str) -> str:
    """The closing piece: what was just said to the NPC, then its cue to answer."""
    said = f"{player_input}\n" if player_input else ""
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


def newest_sums(sizes: Sequence[int]) -> tuple[int, ...]:
    """Running totals of sizes taken newest first: entry k is the size of the k newest."""
    return (0, *itertools.accumulate(reversed(sizes)))


def _section(name: str, lines: Sequence[str]) -> Section:
    header = CATEGORY_HEADERS[name]
    body = "".join(lines)
    return Section(
        header=header,
        lines=tuple(lines),
        newest_sums=newest_sums([len(line) for line in lines]),
        text=header + body if lines else "",
    )


def render_state(state: NpcState) -> RenderedState:
    return RenderedState(
        head=render_head(state.system_prompt),
        sections=tuple(
            _section(name, [RENDER[name](item) for item in getattr(state, name)]) for name in RENDER_ORDER
        ),
    )


def token_sizes(rendered: RenderedState, count: Callable[[str], int]) -> TokenSizes:
    return TokenSizes(
        newest_sums=tuple(newest_sums([count(line) for line in s.lines]) for s in rendered.sections),
        headers=tuple(count(s.header) for s in rendered.sections),
    )
