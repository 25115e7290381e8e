"""Shared perception: what is said at a place is one entry of its log, and its listeners refer to it.

When the barrier for a tick passes, the shard appends the tick's events at each of its
places to that place's window (sim.shard._window), once, whoever listens there; nothing
is copied per listener. What a listener remembers of an event is a pure function of the
event and whether it was addressed to it, and that function belongs to the listener's
kind (the brain: `NpcAgent.episode_of`); the engine never words a memory itself. An
event's memory for everyone it was not addressed to is made once and shared by all of
them.

A listener's episodic memory, when it is needed (it speaks), is the newest `limit` of its
private episodes (what it was given, what reached its inbox) merged with the newest
`limit` events of its place's window that it did not say itself: exactly the newest
`limit` of what it would remember if every event heard were its own episode, so the
working memory and the audit's state snapshot are the same, byte for byte.

Mail is what is addressed: an event of the log said to a listener there becomes that
listener's mail for the next tick (it answers, takes it into its dialogue); nobody else is
woken by it. An outside player's input is the exception: its addressee answered it in the
tick that took it (sim.shard._early), so it is in the log, never mail.

Each place's events also go to its chronicle (sim.shard._chronicle), which folds them into
summaries its listeners may recall; the place's log is needed from the oldest event its
window keeps or its chronicle has not folded yet, whichever is older (`front_tick`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from sim.memory import Episode, episode_order
from sim.shard._chronicle import Chronicle
from sim.shard._early import answered_at_once
from sim.shard._window import PlaceWindow
from sim.store import Summaries, Summary
from sim.wire.events import AnyEvent, Speech

__all__ = ["EpisodeOf", "Perception"]

EpisodeOf = Callable[[AnyEvent, bool], Episode]
"""What a listener of some kind remembers of an event, given whether it was addressed to it."""


class Perception:
    """The windows of a shard's places, and the mail their events make.

    `places` maps each place to its listeners; `limit` is the store's hot limit (what a
    working memory can use), `window` the limit the windows keep (at least `limit`; more
    under `--retain-memories`, whose pruning of stored place rows follows the windows).
    """

    def __init__(self, places: Mapping[str, Collection[str]], *, limit: int, window: int,
                 owned: Collection[str] = ()) -> None:
        """`owned`: the places this shard holds beyond those with listeners: each keeps its
        chronicle of everything said there, whoever hears it (sim.shard._whereabouts)."""
        if window < limit:
            raise ValueError(f"a window of {window} cannot serve a hot limit of {limit}")
        self.limit = limit
        self._window = window
        self._windows = {place: PlaceWindow(listeners, window) for place, listeners in places.items() if listeners}
        self._chronicles = {place: Chronicle(place) for place in sorted({*self._windows, *owned})}
        self._since: dict[str, int] = {}  # a listener that walked in: the tick it arrived
        self._folded: list[tuple[str, Summary]] = []
        self._mail: dict[str, list[AnyEvent]] = {}
        self._stored: dict[str, int] = {}  # each place's front tick as the store last had it

    def fronts(self) -> dict[str, int]:
        """Each place's `front_tick`, for the places whose log is needed from some tick."""
        fronts = {}
        for place in {*self._windows, *self._chronicles}:
            front = self.front_tick(place)
            if front is not None:
                fronts[place] = front
        return fronts

    def front_tick(self, place: str) -> int | None:
        """The tick from which the place's log is needed: the oldest event its window keeps or
        its chronicle has not folded, whichever is older."""
        window, chronicle = self._windows.get(place), self._chronicles.get(place)
        fronts = (None if window is None else window.front_tick, None if chronicle is None else chronicle.start)
        ticks = [t for t in fronts if t is not None]
        return min(ticks) if ticks else None

    # --- the log -------------------------------------------------------------------------

    def append(self, place: str, events: Sequence[AnyEvent], *, mail: bool = True) -> None:
        """The place's events of a tick, sorted by (tick, id), into its window; the ones said
        to a listener there become its mail (unless `mail` is false: older ticks on resume)."""
        chronicle = self._chronicles.get(place)
        if chronicle is not None:
            folded = chronicle.append(events)
            if folded is not None:
                self._folded.append((place, folded))
        window = self._windows.get(place)
        if window is None:
            return  # nobody listens there
        window.append(events)
        if mail:
            listeners = window.listeners
            for event in events:
                if (isinstance(event, Speech) and event.to in listeners and event.to != event.speaker
                        and not answered_at_once(event)):
                    self._mail.setdefault(event.to, []).append(event)

    # --- walking in and out --------------------------------------------------------------

    def listeners(self, place: str) -> Collection[str]:
        """This shard's NPCs at `place` now."""
        window = self._windows.get(place)
        return () if window is None else window.listeners

    def arrive(self, listener: str, place: str, tick: int) -> None:
        """`listener` walked into `place` at `tick`: it hears what is said there from then on."""
        window = self._windows.get(place)
        if window is None:
            window = self._windows[place] = PlaceWindow((), self._window)
        window.add(listener)
        self._since[listener] = tick

    def leave(self, listener: str, place: str, episode_of: EpisodeOf) -> list[Episode]:
        """`listener` walked out of `place`: what it heard there that its memory still holds,
        as its own episodes now (nothing it heard is lost when the place's log moves on)."""
        window = self._windows.get(place)
        if window is None:
            return []
        heard, _ = self._heard(window, listener, episode_of)
        window.discard(listener)
        if not window.listeners:
            del self._windows[place]
        return heard

    def perceive(self, place: str, events: Sequence[AnyEvent]) -> int | None:
        """`append` a tick's events; the place's front tick when it moved since the store last
        had it (the store keeps its log from there), else None."""
        self.append(place, events)
        front = self.front_tick(place)
        if front is None or front == self._stored.get(place):
            return None
        self._stored[place] = front
        return front

    def stored(self) -> None:
        """The store holds every place's log from its front tick now (a resume read it back)."""
        self._stored = self.fronts()

    # --- summaries -----------------------------------------------------------------------

    def restore_summaries(self, summaries: Summaries) -> None:
        """The places' summaries as the store holds them (before their logs are appended on resume)."""
        for place, chronicle in self._chronicles.items():
            chronicle.restore(summaries.get(place, ()))

    def take_summaries(self) -> list[tuple[str, Summary]]:
        """The summaries folded since the last call, for the store."""
        folded, self._folded = self._folded, []
        return folded

    def summaries(self, place: str) -> Sequence[Episode]:
        """The place's summaries of its talk (by slot), what its listeners may recall."""
        chronicle = self._chronicles.get(place)
        return () if chronicle is None else chronicle.summaries

    # --- mail ----------------------------------------------------------------------------

    def mail_holders(self) -> Iterable[str]:
        """The listeners something was said to since their last turn."""
        return self._mail.keys()

    def take_mail(self, listener: str) -> list[AnyEvent]:
        """What was said to `listener` at its place since its last turn, in (tick, id) order."""
        return self._mail.pop(listener, [])

    # --- memory --------------------------------------------------------------------------

    def episodic(self, listener: str, place: str, private: tuple[Episode, ...],
                 episode_of: EpisodeOf) -> tuple[Episode, ...]:
        """The listener's episodic memory: the newest `limit` of its private episodes and of
        what it heard at `place`, in recency order."""
        window = self._windows.get(place)
        if window is None:
            return private
        heard, ties = self._heard(window, listener, episode_of)
        if not heard:
            return private
        if ties or (private and episode_order(private[-1]) > episode_order(heard[0])):
            return tuple(sorted((*private, *heard), key=episode_order)[-self.limit :])
        # the usual case: the log's events (in recency order already) are all newer than the
        # private episodes, so the merge is a concatenation
        return (*private, *heard)[-self.limit :]

    def _heard(self, window: PlaceWindow, listener: str, episode_of: EpisodeOf) -> tuple[list[Episode], bool]:
        """The newest `limit` events of `window` that `listener` heard (not said, since it
        arrived), as its memories of them, in recency order; and whether two share a key."""
        heard: list[Episode] = []
        limit, since = self.limit, self._since.get(listener, -1)
        ties, last = False, None
        for entry in window.not_spoken_by(listener):  # newest first, reversed below
            if entry.key[0] < since:
                break
            ties, last = ties or entry.key == last, entry.key
            if entry.to == listener:
                heard.append(episode_of(entry.event, True))
            else:  # the first listener of this kind to need it makes it for all the others
                overheard = entry.overheard
                if overheard is None or overheard[0] is not episode_of:
                    overheard = entry.overheard = (episode_of, episode_of(entry.event, False))
                heard.append(overheard[1])
            if len(heard) == limit:
                break
        heard.reverse()
        return heard, ties
