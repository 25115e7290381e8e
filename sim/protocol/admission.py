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

`Peers` is a shard's side of the barrier's handshake, built on both: barrier messages of
the other shards in (a Join, a Hello, a Welcome), decisions out: a refusal to count, the
tick to re-send from, the Welcomes shard 0 owes (the run nonce, for a shard's Hello).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable

import msgspec

from sim.protocol.barrier import Barrier
from sim.wire.barrier import Hello, Join, Welcome

__all__ = ["Admission", "Peers", "Refused", "Resends"]


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


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    """A peer's barrier message not served: counted by `kind` (the shard names the topic)."""

    kind: str
    peer: str
    why: str


class Peers:
    """The requests of the other shards of the run: `receive` each Join, Hello or Welcome;
    `resend_from(now)` and `welcomes(nonce)` say what is owed them.

    `answers_hello`: shard 0, the one that tells a starting shard the run nonce.
    """

    def __init__(self, barrier: Barrier, *, answers_hello: bool, per_tick: int = 4, interval: float = 1.0) -> None:
        self._barrier = barrier
        self._answers_hello = answers_hello
        self.admission = Admission(per_tick=per_tick)
        self.resends = Resends(interval=interval)
        self._hellos: list[Hello] = []

    def receive(self, message: Join | Hello | Welcome, now: float) -> Refused | None:
        """Take one request in (`now`: the shard's clock); a refusal to count, or None."""
        match message:
            case Join():
                if not self._from_peer(message):
                    return self._conflict(message)
                if not self.admission.first(message.shard, ("join", message.session, message.seq)):
                    return _repeated(message.shard)
                self.resends.request(message.shard, message.tick, now)
            case Hello() if self._answers_hello:
                if not self._from_peer(message):
                    return self._conflict(message)
                if not self.admission.admit(message.shard, ("hello", message.challenge), self._barrier.tick):
                    return _repeated(message.shard)
                self._hellos.append(message)
            case Hello() | Welcome():
                pass  # a Hello for shard 0, a Welcome for a shard learning the nonce
        return None

    def resend_from(self, now: float) -> int | None:
        """The lowest tick whose kept messages are to be re-sent now; None: none is due."""
        return self.resends.due(now)

    def folded(self, now: float) -> dict[str, int]:
        """Per peer, its Joins folded into a later re-send since the last report (once per interval)."""
        return self.resends.report(now)

    def welcomes(self, nonce: bytes | None) -> list[Welcome]:
        """Shard 0: the Welcome for each admitted Hello, with the run nonce (none without a run key)."""
        hellos, self._hellos = self._hellos, []
        if nonce is None:
            return []
        barrier = self._barrier
        return [Welcome(shard=barrier.shard, shards=len(barrier.shards), challenge=hello.challenge, nonce=nonce.hex())
                for hello in hellos]

    def _from_peer(self, message: Join | Hello) -> bool:
        """Another shard of this run, of the same shard count."""
        barrier = self._barrier
        return message.shard != barrier.shard and barrier.same_run(message) and message.shard in barrier.shards

    def _conflict(self, message: Join | Hello) -> Refused | None:
        """Not a peer: an unauthenticated Join or Hello of another shard count is counted
        (a TickDone with another count is what stops the run); our own, or another run's, is not."""
        barrier = self._barrier
        if message.shard == barrier.shard or message.shards == len(barrier.shards) or barrier.trusted:
            return None
        return Refused(kind="unauthenticated shard count conflict", peer=message.shard,
                       why=f"a Join of shard {message.shard} as {message.shard}/{message.shards} on a broker with "
                           "neither login nor run key; only a TickDone with another count stops the run")


def _repeated(peer: str) -> Refused:
    return Refused(kind="repeated barrier request", peer=peer,
                   why="served once already, or the peer's requests for this tick are used up")
