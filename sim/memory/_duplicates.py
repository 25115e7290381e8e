"""Nothing said twice in one prompt: the candidates a working memory chooses from.

A line of dialogue and the memory of the event it was said in say the same thing, the
memory in other words (`player said to me: "..."`). Both name their event (`Line.event`,
`Episode.event`), so they are matched by identity, never by comparing texts. A memory whose
event one of the dialogue's candidate lines records (its newest `max_dialogue_lines`) is
left out before selection, so that the budgets go to distinct items: the line carries it,
in order, among the lines around it. It counts as a `duplicate` in the report.

The candidate set depends on the state and the dialogue's cap only, never on a budget; a
budget that drops a candidate line drops what it carries with it (the memory is as old as
the line, and the dialogue is filled newest first from the larger share).

`leave_out_event` is the other half: a line being answered is the working memory's input,
under `## Now`, so the state it is answered from holds neither that line nor its memory.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from sim.memory._state import Episode, NpcState

__all__ = ["Distinct", "distinct", "leave_out_event"]


class Distinct(NamedTuple):
    """The state a working memory chooses from, and the memories left out as duplicates (oldest first)."""

    state: NpcState
    duplicates: tuple[Episode, ...]


# Key of the cache in a state's instance `__dict__`: the window of candidate lines -> Distinct.
_DISTINCT = "_npcsim_distinct"


def distinct(state: NpcState, max_dialogue_lines: int) -> Distinct:
    """`state` without the memories that a candidate line of its dialogue carries; computed
    once per state and window. The same state when there is none."""
    window = min(max(max_dialogue_lines, 0), len(state.dialogue))
    cache: dict[int, Distinct] = state.__dict__.setdefault(_DISTINCT, {})
    found = cache.get(window)
    if found is None:
        found = cache[window] = _distinct(state, window)
    return found


def _distinct(state: NpcState, window: int) -> Distinct:
    lines = state.dialogue[len(state.dialogue) - window :] if window else ()
    said = {line.event for line in lines if line.event is not None}
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
