"""Where every NPC of the run stands, what it does there, and which shards hear each place.

Every shard holds the whole run's whereabouts, and every shard moves everyone at the same
tick, in the same order, so all agree on who stands where without a message per move. At
the start of tick t (`advance`):
1. the moves chosen in tick t-1 (an NPC's `go_to`, in its shard's TickDone) and the game's
   moves taken for tick t (run-wide inputs, in shard 0's TickDone), by NPC id;
2. the routines: an NPC whose schedule entry changes at the hour tick t begins walks to
   the entry's place (its home, `location`, when no entry covers the hour), and a move of
   its own choosing ends there.
A move chosen at t-1 and not yet ended by the routine is an `override`; overrides are few,
and kept with each tick's commit, so a resumed shard finds everyone where they stood.

An NPC's state stays with the shard of its home place; a place is heard by its owner (the
shard that holds it: its chronicle) and by every shard with an NPC there (`hears`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from sim.day import PLACES_KEY, Routine, clock_text, hour_of
from sim.memory import WorldFact
from sim.scenario import Scenario

__all__ = ["ChosenPlace", "Moved", "Whereabouts"]


class ChosenPlace(msgspec.Struct, frozen=True, array_like=True):
    """A place an NPC was moved to off its routine (its `go_to`, the game's move), and what
    it does there, since `tick`."""

    location: str
    activity: str
    tick: int


class Moved(msgspec.Struct, frozen=True, array_like=True):
    """One NPC's move at the start of a tick (to another place, or to another activity where it stands)."""

    npc: str
    origin: str
    location: str
    activity: str


class Whereabouts:
    """The run's NPCs' places at the tick under way; `owner` maps each place to its shard."""

    def __init__(self, scenario: Scenario, owner: Mapping[str, int]) -> None:
        self.owner = owner
        self._map = scenario.place_map
        self._reachable: dict[str, str] = {}  # place -> the places reachable from it, as a world-state value
        self.ticks_per_day = scenario.scenario.ticks_per_day
        self.home = {spec.id: spec.location for spec in scenario.npcs}
        """Each NPC's home: its scenario `location`, on the shard that holds its state."""
        self.where: dict[str, str] = dict(self.home)
        self.activity: dict[str, str] = {}
        self.overrides: dict[str, ChosenPlace] = {}
        self.routines = {spec.id: Routine(spec.schedule) for spec in scenario.npcs if spec.schedule}
        self._changes: dict[int, list[str]] = {}  # hour -> the NPCs whose entry differs from the hour before's
        for npc, routine in sorted(self.routines.items()):
            for hour in routine.changes:
                self._changes.setdefault(hour, []).append(npc)
        everyone: dict[str, list[str]] = {}
        for npc in sorted(self.home):
            everyone.setdefault(self.home[npc], []).append(npc)
        self._at = everyone
        self._visits: dict[str, Counter[int]] = {}  # place -> shards with NPCs there, counted
        for place, ids in everyone.items():
            self._visits[place] = Counter(owner[self.home[npc]] for npc in ids)

    def at(self, place: str) -> Sequence[str]:
        """Every NPC at `place`, in any shard, in id order."""
        return self._at.get(place, ())

    def hears(self, place: str, shard: int) -> bool:
        """Whether `shard` hears `place` now: it holds the place, or an NPC of its stands there."""
        visits = self._visits.get(place)
        return self.owner[place] == shard or (visits is not None and visits[shard] > 0)

    def heard_beyond(self, place: str, shard: int) -> bool:
        """Whether a shard other than `shard` hears `place` now."""
        visits = self._visits.get(place)
        return self.owner[place] != shard or (visits is not None and any(
            n for other, n in visits.items() if other != shard))

    def scene(self, npc: str, tick: int, *, go_to: bool) -> tuple[WorldFact, ...]:
        """What an NPC knows of its day as world state (never truncated): the time when the
        world has a day; where it stands and what it does there once it can move or has
        moved; where it can walk when it may `go_to`."""
        scene = []
        if self.ticks_per_day is not None:
            scene.append(WorldFact(key="time", value=clock_text(tick, self.ticks_per_day)))
        place = self.where[npc]
        if self.ticks_per_day is not None or go_to or place != self.home[npc]:
            scene.append(WorldFact(key="location", value=place))
            activity = self.activity.get(npc)
            if activity:
                scene.append(WorldFact(key="activity", value=activity))
        if go_to:
            scene.append(WorldFact(key=PLACES_KEY, value=self._reachable_from(place)))
        return tuple(scene)

    def _reachable_from(self, place: str) -> str:
        listed = self._reachable.get(place)
        if listed is None:
            listed = self._reachable[place] = ", ".join(
                p for p in sorted(self.owner) if p != place and self._map.reachable(place, p))
        return listed

    # --- moving ------------------------------------------------------------------------

    def arrived(self, npc: str, tick: int) -> int:
        """When `npc` came to where its routine has it at `tick`: the first tick of the run of
        hours before it with the same place (-1: the whole day, or it has no routine). A
        resumed shard takes an NPC's arrival from here unless its commit says otherwise."""
        routine, tpd = self.routines.get(npc), self.ticks_per_day
        if routine is None or tpd is None:
            return -1
        home, hour = self.home[npc], hour_of(tick, tpd)
        here = routine.place_at(hour, home)[0]
        back = next((k for k in range(1, 24) if routine.place_at(hour - k, home)[0] != here), None)
        if back is None:
            return -1
        start = (hour - back + 1) % 24
        first = tick - tick % tpd + -(-start * tpd // 24)  # the first tick of that hour, this day
        if first > tick:
            first -= tpd
        return max(first, -1)

    def begin(self, tick: int, overrides: Mapping[str, ChosenPlace], *, resumed: bool) -> list[Moved]:
        """Everyone where they stand as the first tick this process steps begins: a fresh run's
        at the routines' places at its hour; a resumed one's where the last committed tick
        left them (the routines' places at that tick, then the overrides), the moves at the
        start of `tick` still to make (`advance`)."""
        moved: list[Moved | None] = []
        if self.ticks_per_day is not None:
            hour = hour_of(tick - 1 if resumed else tick, self.ticks_per_day)
            for npc, routine in sorted(self.routines.items()):
                moved.append(self._place(npc, *routine.place_at(hour, self.home[npc])))
        for npc, placement in sorted(overrides.items()):
            moved.append(self._place(npc, placement.location, placement.activity))
        self.overrides = dict(overrides)
        return [move for move in moved if move is not None]

    def advance(self, tick: int, chosen: Iterable[tuple[str, str]]) -> list[Moved]:
        """The moves at the start of `tick`: the chosen ones (npc, place), then the routines'."""
        moved: list[Moved | None] = []
        for npc, place in sorted(set(chosen)):
            if npc in self.home and place in self.owner:
                self.overrides[npc] = ChosenPlace(place, "", tick)
                moved.append(self._place(npc, place, ""))
        tpd = self.ticks_per_day
        if tpd is not None and tick > 0 and hour_of(tick, tpd) != hour_of(tick - 1, tpd):
            hour = hour_of(tick, tpd)
            for npc in self._changes.get(hour, ()):
                self.overrides.pop(npc, None)
                moved.append(self._place(npc, *self.routines[npc].place_at(hour, self.home[npc])))
        return [move for move in moved if move is not None]

    def _place(self, npc: str, place: str, activity: str) -> Moved | None:
        """Put `npc` at `place` doing `activity`; the move when its place or activity changed."""
        origin = self.where[npc]
        before = self.activity.get(npc, "")
        if activity:
            self.activity[npc] = activity
        else:
            self.activity.pop(npc, None)
        if origin == place:
            return None if activity == before else Moved(npc, origin, place, activity)
        self.where[npc] = place
        shard = self.owner[self.home[npc]]
        old = self._at[origin]
        del old[bisect.bisect_left(old, npc)]
        bisect.insort(self._at.setdefault(place, []), npc)
        self._visits[origin][shard] -= 1
        self._visits.setdefault(place, Counter())[shard] += 1
        return Moved(npc, origin, place, activity)
