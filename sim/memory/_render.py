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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from sim.memory._state import Belief, Episode, Fact, Line, NpcState, WorldFact

__all__ = [
    "CATEGORY_HEADERS",
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


def render_tail(agent_id: str, player_input: str) -> str:
    """The closing piece: what was just said to the NPC, then its cue to answer."""
    said = f"{player_input}\n" if player_input else ""
    return f"{TAIL_HEADER}{said}{agent_id}:"


class Section(msgspec.Struct, frozen=True):
    """One category's rendered items, oldest first, and their sizes in characters."""

    header: str
    lines: tuple[str, ...]
    sizes: tuple[int, ...]
    text: str  # header + every line: the section as rendered when nothing is dropped


class RenderedState(msgspec.Struct, frozen=True):
    head: str
    canonical_facts: Section
    world_state: Section
    beliefs: Section
    episodic: Section
    dialogue: Section


class TokenSizes(msgspec.Struct, frozen=True):
    """Per-item token counts of a rendered state; headers counted on their own."""

    canonical_facts: tuple[tuple[int, ...], int]
    world_state: tuple[tuple[int, ...], int]
    beliefs: tuple[tuple[int, ...], int]
    episodic: tuple[tuple[int, ...], int]
    dialogue: tuple[tuple[int, ...], int]


def _section(name: str, lines: Sequence[str]) -> Section:
    header = CATEGORY_HEADERS[name]
    body = "".join(lines)
    return Section(
        header=header,
        lines=tuple(lines),
        sizes=tuple(map(len, lines)),
        text=header + body if lines else "",
    )


def render_state(state: NpcState) -> RenderedState:
    return RenderedState(
        head=render_head(state.system_prompt),
        canonical_facts=_section("canonical_facts", [render_fact(f) for f in state.canonical_facts]),
        world_state=_section("world_state", [render_world(w) for w in state.world_state]),
        beliefs=_section("beliefs", [render_belief(b) for b in state.beliefs]),
        episodic=_section("episodic", [render_episode(e) for e in state.episodic]),
        dialogue=_section("dialogue", [render_line(line) for line in state.dialogue]),
    )


def token_sizes(rendered: RenderedState, count: Callable[[str], int]) -> TokenSizes:
    def sizes(section: Section) -> tuple[tuple[int, ...], int]:
        return tuple(count(line) for line in section.lines), count(section.header)

    return TokenSizes(
        canonical_facts=sizes(rendered.canonical_facts),
        world_state=sizes(rendered.world_state),
        beliefs=sizes(rendered.beliefs),
        episodic=sizes(rendered.episodic),
        dialogue=sizes(rendered.dialogue),
    )
