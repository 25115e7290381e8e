"""Which requests of its peers a shard serves: each Join or Hello once, a few per peer and tick. Sans-I/O.

A Join makes a shard re-send everything it keeps; a Hello makes shard 0 answer with the
run's nonce. Both are cheap to replay: a Join captured once and replayed 3,000 times made a
shard re-send its barrier messages 2,262 times. So every request carries a name (a Join's
session and count, a Hello's challenge), and `Admission.admit` serves a name once, and at
most `per_tick` requests of one peer while the shard waits at one tick. A shard that really
starts again has a new session, so it is always served; a broker restart makes each shard
send one new Join.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["Admission"]


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
        served = self._served.setdefault(peer, OrderedDict())
        at, count = self._this_tick.get(peer, (tick, 0))
        if at != tick:
            count = 0
        if name in served or count >= self.per_tick:
            self.refused += 1
            return False
        served[name] = None
        if len(served) > self._remember:
            served.popitem(last=False)
        self._this_tick[peer] = (tick, count + 1)
        return True
