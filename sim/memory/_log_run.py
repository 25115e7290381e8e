"""The log layout's run (`sim.memory._log`): its candidates in order, and the newest run of
them that a build keeps, grown older while each next entry fits its kind's cap and the room."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from sim.memory._duplicates import carried
from sim.memory._state import Episode, Line, NpcState
from sim.memory.render import LOG_HEADER

__all__ = ["LogEntry", "LogRun", "log_entries"]


class LogEntry(NamedTuple):
    """One item of the log's candidates: a line (`line`) or a memory, at `position` in its
    tuple of the state; `key` is its place in the log."""

    key: tuple[int, int, int]
    line: bool
    position: int
    item: Episode | Line


_ENTRIES = "_npcsim_log_entries"


def log_entries(state: NpcState) -> tuple[LogEntry, ...]:
    """The log's candidates, oldest first: every line, and every memory whose event no line of
    the state records; a memory before a line of the same tick. Computed once per state."""
    found: tuple[LogEntry, ...] | None = state.__dict__.get(_ENTRIES)
    if found is None:
        lines = carried(state)
        said = lines.said(range(len(state.dialogue))) if lines is not None else frozenset()
        entries = [LogEntry((e.tick, 0, q), False, q, e) for q, e in enumerate(state.episodic) if q not in said]
        entries += [LogEntry((line.tick, 1, p), True, p, line) for p, line in enumerate(state.dialogue)]
        entries.sort(key=lambda entry: entry.key)
        found = state.__dict__[_ENTRIES] = tuple(entries)
    return found


@dataclass(slots=True)
class LogRun:
    """The log's kept run: `entries[start:]`, its texts and sizes, and what stopped it."""

    entries: tuple[LogEntry, ...]
    texts: list[str]
    tokens: list[int] | None
    header_tokens: int
    caps: tuple[int, int]  # lines, memories
    start: int = 0
    lines: int = 0
    memories: int = 0
    stopped_by_cap: bool = False

    def __post_init__(self) -> None:
        self.start = len(self.entries)

    def grow(self, room: int, token_room: int) -> tuple[int, int]:
        """Take older entries while the next one fits its cap and both rooms; the rooms left."""
        while self.start > 0:
            entry = self.entries[self.start - 1]
            if (self.lines if entry.line else self.memories) >= self.caps[0 if entry.line else 1]:
                self.stopped_by_cap = True
                break
            first = self.start == len(self.entries)
            chars = len(self.texts[self.start - 1]) + (len(LOG_HEADER) if first else 0)
            tokens = 0
            if self.tokens is not None:
                tokens = self.tokens[self.start - 1] + (self.header_tokens if first else 0)
            if chars > room or tokens > token_room:
                self.stopped_by_cap = False
                break
            room -= chars
            token_room -= tokens
            self.take(entry)
            self.start -= 1
        return room, token_room

    def take(self, entry: LogEntry, sign: int = 1) -> None:
        if entry.line:
            self.lines += sign
        else:
            self.memories += sign

    def drop_oldest(self) -> None:
        self.take(self.entries[self.start], -1)
        self.start += 1

    def restart(self, start: int) -> None:
        self.start, self.lines, self.memories = len(self.entries), 0, 0
        while self.start > start:
            self.start -= 1
            self.take(self.entries[self.start])

    def kept(self) -> tuple[LogEntry, ...]:
        return self.entries[self.start :]

    def kind_size(self, *, line: bool) -> tuple[int, int]:
        """Characters and tokens of the kept lines (`line`) or memories, without the header."""
        kept = [i for i in range(self.start, len(self.entries)) if self.entries[i].line == line]
        tokens = sum(self.tokens[i] for i in kept) if self.tokens is not None else 0
        return sum(len(self.texts[i]) for i in kept), tokens
