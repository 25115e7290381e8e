"""A scenario's day: the clock read from a tick, NPC routines by the hour, and the paths between places.

Pure (no I/O): the scenario loader checks schedules and exits with it, and the engine asks it
where an NPC should be at a tick and whether it can walk there.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated

import msgspec

__all__ = [
    "GOAL_FACT",
    "GO_TO",
    "PLACES_KEY",
    "PlaceMap",
    "Routine",
    "ScheduleEntry",
    "check_schedule",
    "clock_text",
    "day_of",
    "goal_text",
    "hour_of",
]

HOURS = 24

GO_TO = "go_to"
"""The intent the engine applies itself: `go_to {location}`, when the NPC's intents allow it."""

PLACES_KEY = "places_you_can_go"
"""The world-state entry that lists where an NPC with `go_to` can walk from where it stands;
its `location` argument must be one of them (else the gates say `intent_args`)."""

GOAL_FACT = "current-goal"
"""The id of the canonical fact that holds an NPC's goal (its scenario's, or the game's)."""


def goal_text(goal: str) -> str:
    """The goal fact's text: what the NPC reads in every prompt."""
    return f"Your current goal: {goal}"


class ScheduleEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where an NPC is from an hour on, and what it does there."""

    hour: int
    location: str
    activity: Annotated[str, msgspec.Meta(max_length=200)] = ""
    until: int | None = None
    """The exclusive end hour (1..24); None: up to the next entry's hour, round the clock."""


def hour_of(tick: int, ticks_per_day: int) -> int:
    """The hour (0..23) a tick falls in."""
    return (tick % ticks_per_day) * HOURS // ticks_per_day


def day_of(tick: int, ticks_per_day: int) -> int:
    """The day a tick falls in, the first day being 1."""
    return tick // ticks_per_day + 1


def clock_text(tick: int, ticks_per_day: int) -> str:
    """The time of a tick as a person reads it: "day 1, 08:00"."""
    minutes = (tick % ticks_per_day) * HOURS * 60 // ticks_per_day
    return f"day {day_of(tick, ticks_per_day)}, {minutes // 60:02d}:{minutes % 60:02d}"


class Routine:
    """A schedule compiled to a 24-slot table, so that the engine's question each tick is a lookup."""

    __slots__ = ("_any", "_slots", "changes")

    def __init__(self, entries: Sequence[ScheduleEntry]) -> None:
        slots: list[ScheduleEntry | None] = [None] * HOURS
        starts = sorted({entry.hour for entry in entries})
        for entry in entries:
            if entry.until is not None:
                end = entry.until
            else:
                later = [hour for hour in starts if hour > entry.hour]
                end = later[0] if later else starts[0] + HOURS
            for hour in range(entry.hour, end):
                slots[hour % HOURS] = entry
        self._slots = tuple(slots)
        self._any = bool(entries)
        self.changes = tuple(hour for hour in range(HOURS) if slots[hour] is not slots[hour - 1])
        """The hours at whose start the covering entry changes (where the NPC may walk)."""

    def at(self, hour: int) -> ScheduleEntry | None:
        """The entry covering `hour`, or None: the NPC stays home."""
        return self._slots[hour]

    def place_at(self, hour: int, home: str) -> tuple[str, str]:
        """Where the NPC is at `hour` (0..23, or any hour: taken round the clock) and what it
        does there: its entry's place and activity, or its `home` and nothing."""
        entry = self._slots[hour % HOURS]
        return (entry.location, entry.activity) if entry else (home, "")

    def __bool__(self) -> bool:
        return self._any


def check_schedule(entries: Sequence[ScheduleEntry], places: Collection[str]) -> str | None:
    """None for a schedule `Routine` can compile; else one line naming its first problem."""
    for entry in entries:
        if entry.location not in places:
            return f"unknown place {entry.location!r}"
        if not 0 <= entry.hour < HOURS:
            return f"hour {entry.hour} is not in 0..23"
        if entry.until is not None and not entry.hour < entry.until <= HOURS:
            return f"until {entry.until} (hour {entry.hour}) is not in {entry.hour + 1}..24"
    ordered = sorted(entries, key=lambda entry: entry.hour)
    for this, after in itertools.pairwise(ordered):
        if this.hour == after.hour or (this.until is not None and after.hour < this.until):
            return f"the entries at hour {this.hour} and hour {after.hour} overlap"
    return None


class PlaceMap:
    """Which places can be walked between: exits are two-way, and a scenario that lists none
    leaves every place reachable from every other (as before exits existed)."""

    def __init__(self, exits: Mapping[str, Sequence[str]]) -> None:
        self._open = not any(exits.values())
        neighbours: dict[str, set[str]] = {place: set() for place in exits}
        for place, ways in exits.items():
            for other in ways:
                neighbours[place].add(other)
                neighbours.setdefault(other, set()).add(place)
        self._part: dict[str, str] = {}  # place -> the first place found of its connected part
        for first in neighbours:
            if first in self._part:
                continue
            self._part[first], queue = first, deque([first])
            while queue:
                for other in neighbours[queue.popleft()]:
                    if other not in self._part:
                        self._part[other] = first
                        queue.append(other)

    def reachable(self, start: str, goal: str) -> bool:
        """Whether a path of exits leads from `start` to `goal` (a place always reaches itself)."""
        if self._open or start == goal:
            return True
        part = self._part.get(start)
        return part is not None and part == self._part.get(goal)
