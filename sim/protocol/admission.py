"""Which requests of its peers a shard serves, and how often. Sans-I/O.

A Join makes a shard re-send everything it keeps; a Hello makes shard 0 answer with the
run's nonce. Both are cheap to replay: a Join captured once and replayed 3,000 times made a
shard re-send its barrier messages 2,262 times. So every request carries a name (a Join's
session and count, a Hello's challenge), and `Admission.admit` serves a name once, and at
most `per_tick` requests of one peer while the shard waits at one tick. A shard that really
starts again has a new session, so it is always served; a broker restart makes each shard
send one new Join.

Names stop a replay, not a forgery: on a broker with neither login nor run key anyone can
send Joins with fresh sessions, and four re-sends per peer and tick made a flood of 3,000
of them re-send four times at every tick for as long as it lasted. So the re-sends a
peer's Joins ask for go through `Resends`: at most one per peer per `interval` seconds of
the shard's clock. A Join that comes sooner is not refused (it may be the peer's real one,
sent after its own restart, that the flood is drowning): it is folded into the peer's
waiting request, served when the interval is over, from the lowest tick any of them asked
for. Folded requests are counted, and reported once per interval.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["Admission", "Resends"]


class Admission:
    """Per peer: the names already served (the newest `remember`) and the requests served this tick."""

    def __init__(self, *, per_tick: int = 4, remember: int = 1024) -> None:
        self.per_tick = per_tick
        self._remember = remember
        self._served: dict[str, OrderedDict[Hashable, None]] = {}
        self._this_tick: dict[str, tuple[int, int]] = {}  # peer -> (tick, served at that tick)
        self.refused = 0

    def admit(self, peer: str, name: Hashable, tick: int) -> bool:
        """True when the request `name` of `peer` is to be served now, at the shard's tick `tick`."""
        at, count = self._this_tick.get(peer, (tick, 0))
        if at != tick:
            count = 0
        if count >= self.per_tick:
            self.refused += 1
            return False
        if not self.first(peer, name):
            return False
        self._this_tick[peer] = (tick, count + 1)
        return True

    def first(self, peer: str, name: Hashable) -> bool:
        """True the first time `peer` makes the request `name` (among its newest `remember`)."""
        served = self._served.setdefault(peer, OrderedDict())
        if name in served:
            self.refused += 1
            return False
        served[name] = None
        if len(served) > self._remember:
            served.popitem(last=False)
        return True


class Resends:
    """The re-sends peers asked for: one per peer per `interval` seconds, the rest folded in.

    `request(peer, tick, now)` asks for a re-send of what is kept for ticks >= `tick`;
    `due(now)` is the lowest tick to re-send from now (None: nothing due), and starts the
    interval of every peer it serves. `now` is the shard's clock (virtual in tests).
    """

    def __init__(self, *, interval: float = 1.0) -> None:
        self.interval = interval
        self._waiting: dict[str, int] = {}  # peer -> the lowest tick its waiting requests asked for
        self._served_at: dict[str, float] = {}  # peer -> when its last re-send was made
        self._folded: dict[str, int] = {}  # peer -> requests folded since the last report
        self._reported_at: float | None = None
        self.resends = 0  # re-sends made
        self.folded = 0  # requests folded into a waiting one (the rate limit at work)

    def request(self, peer: str, tick: int, now: float) -> None:
        waiting = self._waiting.get(peer)
        if waiting is not None or now - self._served_at.get(peer, -math.inf) < self.interval:
            self.folded += 1
            self._folded[peer] = self._folded.get(peer, 0) + 1
        self._waiting[peer] = tick if waiting is None else min(waiting, tick)

    def due(self, now: float) -> int | None:
        ready = [peer for peer in self._waiting if now - self._served_at.get(peer, -math.inf) >= self.interval]
        if not ready:
            return None
        since = min(self._waiting.pop(peer) for peer in ready)
        for peer in ready:
            self._served_at[peer] = now
        self.resends += 1
        return since

    def waiting(self) -> bool:
        """Whether a request waits for its peer's interval to end."""
        return bool(self._waiting)

    def report(self, now: float) -> dict[str, int]:
        """Per peer, the requests folded since the last report; empty until `interval` has
        passed since that report (one log line per interval, however many arrive)."""
        if not self._folded or (self._reported_at is not None and now - self._reported_at < self.interval):
            return {}
        folded, self._folded = self._folded, {}
        self._reported_at = now
        return folded
