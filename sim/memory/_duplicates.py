"""Nothing said twice in one prompt: a memory whose line the prompt keeps is left out.

A line of dialogue and the memory of the event it was said in say the same thing, the
memory in other words (`player said to me: "..."`). Both name their event (`Line.event`,
`Episode.event`), so they are matched by identity, never by comparing texts. A memory whose
event a line the working memory keeps records is left out: the line carries it, in order,
among the lines around it. It counts as a `duplicate` in the report, and only it: a memory
whose line is not kept (past the dialogue's cap, or dropped by its budget) is a candidate
like any other, so that an event is said once, never lost with the line that said it while
its memory would fit.

So the dialogue is chosen before the memories (`sim.memory._selection`, `Duplicates`), and
`carried` is what that choice needs: per line, the memories it carries.

`leave_out_event` is the other half: a line being answered is the working memory's input,
under `## Now`, so the state it is answered from holds neither that line nor its memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from sim.memory._state import Episode, Line, NpcState

__all__ = ["Carried", "Distinct", "carried", "distinct", "leave_out_event"]


class Distinct(NamedTuple):
    """A state without the memories some lines carry, and those memories (oldest first)."""

    state: NpcState
    duplicates: tuple[Episode, ...]


def distinct(state: NpcState, lines: Iterable[Line]) -> Distinct:
    """`state` without the memories whose event one of `lines` records (a working memory's
    kept dialogue: its memories are chosen among what is left). The same state when none."""
    said = {line.event for line in lines if line.event is not None}
    if not said or not any(e.event in said for e in state.episodic):
        return Distinct(state, ())
    kept = tuple(e for e in state.episodic if e.event not in said)
    duplicates = tuple(e for e in state.episodic if e.event in said)
    return Distinct(msgspec.structs.replace(state, episodic=kept), duplicates)


class Carried:
    """The memories a state's lines carry: `by_line[p]`, the positions of the memories of the
    event of the line at position p. The memories' orders without what some lines carry are
    remembered per order and memories left out: a retry and an explanation build the same
    state again."""

    __slots__ = ("_orders", "by_line", "newest_first")

    def __init__(self, by_line: tuple[tuple[int, ...], ...], memories: int) -> None:
        self.by_line = by_line
        self.newest_first = tuple(range(memories - 1, -1, -1))
        self._orders: dict[tuple[tuple[int, ...], frozenset[int]], tuple[int, ...]] = {}

    def said(self, lines: Iterable[int]) -> frozenset[int]:
        """The memories the lines at these positions carry."""
        by_line = self.by_line
        return frozenset(itertools.chain.from_iterable(by_line[p] for p in lines))

    def unsaid(self, order: tuple[int, ...], said: frozenset[int]) -> tuple[int, ...]:
        """`order` (memory positions) without `said`."""
        key = (order, said)
        found = self._orders.get(key)
        if found is None:
            found = self._orders[key] = tuple([p for p in order if p not in said])
        return found


# Key of the cache in a state's instance `__dict__`.
_CARRIED = "_npcsim_carried"


def carried(state: NpcState) -> Carried | None:
    """What the lines of `state` carry; None when no memory records the event of a line.
    Computed once per state."""
    if _CARRIED not in state.__dict__:
        memories: dict[str, list[int]] = {}
        for q, episode in enumerate(state.episodic):
            if episode.event is not None:
                memories.setdefault(episode.event, []).append(q)
        found = None
        if memories and any(line.event in memories for line in state.dialogue):
            by_line = tuple(tuple(memories.get(line.event, ())) if line.event is not None else ()
                            for line in state.dialogue)
            found = Carried(by_line, len(state.episodic))
        state.__dict__[_CARRIED] = found
    cached: Carried | None = state.__dict__[_CARRIED]
    return cached


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
