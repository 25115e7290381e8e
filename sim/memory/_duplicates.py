"""Nothing said twice in one prompt: the candidates a working memory chooses from.

A line of dialogue and the memory of the event it was said in say the same thing, the
memory in other words (`player said to me: "..."`). Both name their event (`Line.event`,
`Episode.event`), so they are matched by identity, never by comparing texts. A memory whose
event one of the dialogue's candidate lines records (the lines it can keep: its newest
`max_dialogue_lines`, or with a scored selection the first `max_dialogue_lines` of its
ranking) is left out before selection, so that the budgets go to distinct items: the line carries it,
in order, among the lines around it. It counts as a `duplicate` in the report.

The candidate set depends on the state and the dialogue's cap (and a scored selection's
ranking) only, never on a budget; a budget that drops a candidate line drops what it
carries with it (the dialogue, filled first in its order, has the largest share).

`leave_out_event` is the other half: a line being answered is the working memory's input,
under `## Now`, so the state it is answered from holds neither that line nor its memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from sim.memory._state import Episode, NpcState

__all__ = ["Distinct", "distinct", "leave_out_event"]


class Distinct(NamedTuple):
    """The state a working memory chooses from, and the memories left out as duplicates (oldest first)."""

    state: NpcState
    duplicates: tuple[Episode, ...]


# Key of the cache in a state's instance `__dict__`: the candidate lines (their count when
# they are the newest, else their positions) -> Distinct.
_DISTINCT = "_npcsim_distinct"


def distinct(state: NpcState, max_dialogue_lines: int, ranked_lines: Sequence[int] | None = None) -> Distinct:
    """`state` without the memories that a candidate line of its dialogue carries; computed
    once per state and candidate lines. The same state when there is none.

    The candidate lines are the newest `max_dialogue_lines`, or the first of `ranked_lines`
    (the dialogue's positions in the state, best first: a scored selection's ranking).
    """
    window = min(max(max_dialogue_lines, 0), len(state.dialogue))
    key: int | tuple[int, ...] = window if ranked_lines is None else tuple(sorted(ranked_lines[:window]))
    cache: dict[int | tuple[int, ...], Distinct] = state.__dict__.setdefault(_DISTINCT, {})
    found = cache.get(key)
    if found is None:
        n = len(state.dialogue)
        found = cache[key] = _distinct(state, range(n - window, n) if isinstance(key, int) else key)
    return found


def _distinct(state: NpcState, positions: Sequence[int]) -> Distinct:
    lines = state.dialogue
    said = {lines[p].event for p in positions if lines[p].event is not None}
    if not said or not any(e.event in said for e in state.episodic):
        return Distinct(state, ())
    kept = tuple(e for e in state.episodic if e.event not in said)
    duplicates = tuple(e for e in state.episodic if e.event in said)
    return Distinct(msgspec.structs.replace(state, episodic=kept), duplicates)


def leave_out_event(state: NpcState, event: str) -> NpcState:
    """`state` without the lines and memories of `event`: what a working memory answering
    the line said in it is built from (the line is its input). The same state when none."""
    if not any(line.event == event for line in state.dialogue) and not any(e.event == event for e in state.episodic):
        return state
    return msgspec.structs.replace(
        state,
        dialogue=tuple(line for line in state.dialogue if line.event != event),
        episodic=tuple(e for e in state.episodic if e.event != event),
    )
