"""The tick barrier across the shards of a run: sans-I/O bookkeeping, no client, no awaits.

Bulk-synchronous ticks: no shard begins tick t+1 before every shard of the run finished
tick t and every batch published for tick t reached every shard that routes its topic.
MQTT orders messages per topic only (a clustered broker may not even keep that), so a
shard cannot infer "nothing more is coming" from the order of arrival. Instead each
shard, after publishing its batches for tick t, publishes a `TickDone` on
`barrier/{shard}` that lists every topic it published to for t with the batch's event
count. A receiver passes the barrier for t when it holds a `TickDone` for t from every
shard and, for each listed topic it routes, that shard's batch for t: exactly what the
senders said, whatever order things arrived in.

Faults are repaired by re-sending, never by skipping: a shard keeps its own batches and
`TickDone`s of the ticks a peer may still need (`keep`) and hands them back for
re-sending (`kept`) after a reconnect or when a peer announces itself with a `Join`
(a shard that starts late, restarts after a broker outage, or comes back with
`--resume`). What it keeps for tick t-2 is forgotten once the barrier for t passed: by
then every shard committed t-1 (a shard sends its `TickDone` for t only after that
commit), so a shard killed now resumes from t-1 at the earliest and asks for t-1, never
for t-2. (Forgetting t-1 already would strand a shard killed after sending its TickDone
for t but before committing t: it resumes from t-1, and t-1 would be gone.)

A tick may begin before the run's pace when outside input waits for it (docs/operations.md,
"Ticks"): the shard holding that input says so with a `Start` for the tick (`start`), and
every shard that holds one for its next tick (`starts`) begins it as soon as its barrier
for the tick before passed. A Start changes when a tick begins, never what it takes, so
it is neither kept nor re-sent.

The shell (sim.shard.Shard) feeds received batches and barrier messages in and asks
`passed`; `awaited` says whom the shard is waiting for, for the status topic and the live
display. Every message carries the run's shard count: a shard started with another count
(`--shard 1/3` beside `--shard 0/2`) would hold the run forever, so `conflict` names it,
and the shard stops. Only a conflict the shard can believe stops it: with a run key or a
broker login every barrier message is authenticated (`trusted`); on a broker with
neither, anyone can forge a Join, so a Join with another count is only counted
(`ignored_conflicts`), and a TickDone with another count (what a misconfigured shard sends
after its first tick) is the conflict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.wire.barrier import BarrierMessage, Join, Start, TickDone
from sim.wire.inputs import RunWide

__all__ = ["Barrier", "summarise"]

_SHOWN = 4  # names in a summarised list of what the barrier waits for


def summarise(awaited: Sequence[str], shown: int = _SHOWN) -> str:
    """What the barrier waits for, in one short line: the first `shown`, then "and N more"."""
    if len(awaited) <= shown + 1:
        return ", ".join(awaited)
    return f"{', '.join(awaited[:shown])} and {len(awaited) - shown} more"


class Barrier:
    """One shard's view of the barrier: what it received, what it kept for re-sending.

    `shards` names every shard of the run; `routes(topic)` says whether this shard
    receives `topic` (only those batches are waited for). `trusted`: barrier messages are
    authenticated (run key or broker login), so any of them may name a conflict; `session`
    names this shard's process in its Joins.
    """

    def __init__(
        self,
        shard: str,
        shards: Sequence[str],
        routes: Callable[[str], bool],
        *,
        tick: int = 0,
        trusted: bool = True,
        session: str = "",
    ) -> None:
        if shard not in shards:
            raise ValueError(f"shard {shard!r} is not one of {list(shards)}")
        self.shard = shard
        self.shards = tuple(shards)
        self._routes = routes
        self.tick = tick  # the lowest tick whose barrier has not passed here
        self._done: dict[int, dict[str, TickDone]] = {}
        self._batches: dict[int, dict[tuple[str, str], int]] = {}
        self._published: dict[int, dict[str, int]] = {}
        self._kept: dict[int, list[tuple[str, bytes]]] = {}
        self._starts: set[int] = set()  # ticks some shard began before the pace
        self.mismatched: set[tuple[str, int, str]] = set()  # (shard, tick, topic): counts differ
        self.conflict: str | None = None  # a peer that runs with another shard count
        self.trusted = trusted
        self.ignored_conflicts = 0  # unauthenticated Joins with another shard count, dropped
        self.session = session
        self._joins = 0

    # --- receiving -----------------------------------------------------------------------

    def batch_received(self, shard: str, tick: int, topic: str, events: int) -> None:
        """A batch came in (duplicates are harmless); old ticks are ignored."""
        if tick >= self.tick and shard in self.shards:
            self._batches.setdefault(tick, {})[(shard, topic)] = events

    def done_received(self, done: TickDone) -> None:
        if self.same_run(done) and done.tick >= self.tick and done.shard in self.shards:
            self._done.setdefault(done.tick, {})[done.shard] = done

    def start_received(self, start: Start) -> None:
        """A peer began `start.tick` before the pace: so does this shard, once it may."""
        if self.same_run(start) and start.tick >= self.tick and start.shard in self.shards:
            self._starts.add(start.tick)

    def starts(self, tick: int) -> bool:
        """Whether some shard (this one included) began `tick` before the pace."""
        return tick in self._starts

    def same_run(self, message: BarrierMessage) -> bool:
        """False (and `conflict` says why) for a message from a shard of another shard count;
        an unauthenticated Join of another count is only counted."""
        if message.shards == len(self.shards):
            return True
        if not self.trusted and not isinstance(message, TickDone):
            self.ignored_conflicts += 1
            return False
        self.conflict = (
            f"shard {message.shard} runs as {message.shard}/{message.shards}, this one as "
            f"{self.shard}/{len(self.shards)}: every shard of a run needs the same count"
        )
        return False

    def passed(self, tick: int) -> bool:
        """Every shard finished `tick` and every batch of `tick` routed here arrived."""
        if tick < self.tick:
            return True
        return not self.awaited(tick)

    def awaited(self, tick: int) -> list[str]:
        """What the barrier for `tick` still waits for, in words, shards in order."""
        if tick < self.tick:
            return []
        done = self._done.get(tick, {})
        got = self._batches.get(tick, {})
        missing: list[str] = []
        for shard in self.shards:
            message = done.get(shard)
            if message is None:
                missing.append(f"shard {shard}")
                continue
            lacking = 0
            for topic, count in message.batches.items():
                if not self._routes(topic):
                    continue
                received = got.get((shard, topic))
                if received is None:
                    lacking += 1
                elif received != count:
                    self.mismatched.add((shard, tick, topic))
            if lacking:
                missing.append(f"{lacking} batch(es) from shard {shard}")
        return missing

    def announced(self, tick: int) -> TickDone | None:
        """Shard 0's TickDone of `tick` (read before `advance`): what every shard applies at
        `tick + 1`, its `world` and `inputs`."""
        return self._done.get(tick, {}).get(self.shards[0])

    def moves(self, tick: int) -> list[tuple[str, str]]:
        """Every shard's chosen moves of `tick` (read before `advance`), applied at `tick + 1`."""
        return [move for done in self._done.get(tick, {}).values() for move in done.moves]

    def advance(self, tick: int) -> None:
        """The barrier for `tick` passed: wait for `tick + 1`, forget what no one can need."""
        if not self.passed(tick):
            raise ValueError(f"the barrier for tick {tick} has not passed: waiting for {self.awaited(tick)}")
        self.tick = max(self.tick, tick + 1)
        for table in (self._done, self._batches, self._published):
            for old in [t for t in table if t <= tick]:
                del table[old]
        self._starts = {t for t in self._starts if t > tick}
        for old in [t for t in self._kept if t < tick - 1]:
            del self._kept[old]

    # --- sending -------------------------------------------------------------------------

    def keep(self, tick: int, topic: str, payload: bytes, *, events: int | None = None) -> None:
        """Remember a message sent for `tick` (a batch when `events` is given) for re-sending."""
        self._kept.setdefault(tick, []).append((topic, payload))
        if events is not None:
            self._published.setdefault(tick, {})[topic] = events

    def finish(self, tick: int, world: dict[str, str] | None = None, inputs: tuple[RunWide, ...] = (),
               moves: tuple[tuple[str, str], ...] = ()) -> TickDone:
        """This shard's TickDone for `tick`, listing the batches kept for it (shard 0's with
        what every shard applies next tick, every shard's with its NPCs' chosen moves); counted
        here too."""
        batches = dict(sorted(self._published.get(tick, {}).items()))
        done = TickDone(shard=self.shard, shards=len(self.shards), tick=tick, batches=batches, world=world,
                        inputs=inputs, moves=moves)
        self.done_received(done)  # our own batches on routed topics still have to come back
        return done

    def start(self, tick: int) -> Start:
        """This shard's Start for `tick`: it begins it now, outside input waiting for it here."""
        self._starts.add(tick)
        return Start(shard=self.shard, shards=len(self.shards), tick=tick)

    def kept_by_tick(self) -> list[tuple[int, str, bytes]]:
        """Everything kept, with its tick: what a shard commits, so that it can re-send it
        after a crash (its store's copy of the last two ticks)."""
        return [(tick, topic, payload) for tick in sorted(self._kept) for topic, payload in self._kept[tick]]

    def kept(self, since: int) -> list[tuple[str, bytes]]:
        """Every kept message for ticks >= `since`, oldest tick first, in sending order."""
        return [item for tick in sorted(self._kept) if tick >= since for item in self._kept[tick]]

    def join(self) -> Join:
        """What this shard announces after (re)connecting: it needs ticks >= its barrier's."""
        join = Join(shard=self.shard, shards=len(self.shards), tick=self.tick, session=self.session, seq=self._joins)
        self._joins += 1
        return join
