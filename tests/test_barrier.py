"""The tick barrier's protocol object, without a broker: unit cases and a stateful model.

The model is a broker that delivers messages in any order, duplicates them, loses
everything in flight when it restarts, and shards that crash and resume from their last
committed tick. Whatever the interleaving, no shard passes the barrier for tick t before
every shard finished t and every batch of t it routes reached it after its last start;
and once the faults stop, every shard reaches the horizon.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from sim.protocol.barrier import Barrier
from sim.wire.barrier import Join, Start, TickDone, decode_barrier, encode_barrier
from sim.wire.inputs import GameFact, Presence

TOPICS = ("loc/a", "loc/b", "agent/x/inbox", "agent/y/inbox")


def routes_for(shard: int, shards: int) -> frozenset[str]:
    return frozenset(t for j, t in enumerate(TOPICS) if j % shards == shard or j == 0)


def test_waits_for_every_shard_and_every_listed_batch() -> None:
    b = Barrier("0", ["0", "1"], lambda t: t in {"loc/a"})
    assert b.awaited(0) == ["shard 0", "shard 1"]
    b.keep(0, "loc/a", b"x", events=2)
    b.finish(0)
    b.done_received(TickDone(shard="1", shards=2, tick=0, batches={"loc/a": 1, "loc/b": 3}))
    assert b.awaited(0) == ["1 batch(es) from shard 0", "1 batch(es) from shard 1"]
    b.batch_received("1", 0, "loc/a", 1)
    b.batch_received("0", 0, "loc/a", 2)
    assert b.passed(0) and not b.passed(1)
    b.advance(0)
    assert b.tick == 1 and b.passed(0)


def test_a_batch_before_its_done_message_counts() -> None:
    b = Barrier("1", ["0", "1"], lambda t: True)
    b.batch_received("0", 4, "loc/a", 1)
    b.done_received(TickDone(shard="0", shards=2, tick=4, batches={"loc/a": 1}))
    b.finish(4)
    assert b.passed(4)


def test_advance_refuses_an_open_barrier_and_old_ticks_are_ignored() -> None:
    b = Barrier("0", ["0", "1"], lambda t: True, tick=3)
    with pytest.raises(ValueError, match="shard 1"):
        b.advance(3)
    b.done_received(TickDone(shard="1", shards=2, tick=2, batches={}))
    assert b.awaited(3) == ["shard 0", "shard 1"]
    assert b.passed(2)


def test_kept_messages_outlive_one_barrier_and_no_more() -> None:
    b = Barrier("0", ["0"], lambda t: False)
    for tick in range(4):
        b.keep(tick, "loc/a", f"b{tick}".encode(), events=1)
        b.keep(tick, "barrier/0", encode_barrier(b.finish(tick)))
        expected = [f"b{t}".encode() for t in range(max(0, tick - 2), tick + 1)]
        assert [p for _, p in b.kept(0) if p.startswith(b"b")] == expected
        b.advance(tick)
        assert [p for _, p in b.kept(0) if p.startswith(b"b")] == expected[-2:]
    assert b.join() == Join(shard="0", shards=1, tick=4)


def test_counts_that_differ_are_noted() -> None:
    b = Barrier("0", ["0", "1"], lambda t: True)
    b.finish(0)
    b.done_received(TickDone(shard="1", shards=2, tick=0, batches={"loc/a": 2}))
    b.batch_received("1", 0, "loc/a", 3)
    assert b.passed(0)
    assert b.mismatched == {("1", 0, "loc/a")}


def test_wire_format_rejects_junk() -> None:
    done = TickDone(shard="2", shards=3, tick=7, batches={"loc/a": 3})
    assert decode_barrier(encode_barrier(done)) == done
    for junk in (b"", b"\xc1", encode_barrier(done)[:-1], msgspec.msgpack.encode({"type": "done", "shard": "x"})):
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            decode_barrier(junk)


def test_only_shard_zeros_tickdone_says_what_every_shard_applies_next_tick() -> None:
    """Shard 0's `world` and `inputs` are announced; another shard's, forged or not, are not."""
    presence, fact = Presence(player="alice", location="inn"), GameFact(npc=None, id="war", text="War broke out")
    b = Barrier("1", ["0", "1"], lambda t: True)
    b.done_received(TickDone(shard="1", shards=2, tick=0, batches={}, inputs=(fact,), world={"king": "dead"}))
    assert b.announced(0) is None  # nothing from shard 0 yet
    zero = TickDone(shard="0", shards=2, tick=0, batches={}, world={"king": "alive"}, inputs=(presence, fact))
    b.done_received(decode_barrier(encode_barrier(zero)))
    assert b.announced(0) == zero
    b.finish(0)
    b.advance(0)
    assert b.announced(0) is None  # forgotten once passed: read before advance


@pytest.mark.parametrize("inputs", [
    [{"type": "presence", "player": "not a name", "location": "inn"}],
    [{"type": "fact", "npc": None, "id": "f", "text": ""}],
    [{"type": "fact", "npc": None, "id": "f", "text": "x" * 4001}],
    [{"type": "input", "player": "p", "to": "innkeeper", "text": "a player's input is no run-wide input"}],
    [{"type": "presence", "player": "p", "location": "inn", "seq": -1}],
])
def test_a_tickdone_with_malformed_run_wide_inputs_is_refused_whole(inputs: list[dict[str, object]]) -> None:
    forged = {"type": "done", "shard": "0", "shards": 2, "tick": 0, "batches": {}, "inputs": inputs}
    with pytest.raises(msgspec.ValidationError):
        decode_barrier(msgspec.msgpack.encode(forged))


def test_a_start_says_a_tick_begins_before_the_pace_until_its_barrier_passed() -> None:
    b = Barrier("0", ["0", "1"], lambda t: False, tick=5)
    assert not b.starts(6)
    b.start_received(Start(shard="1", shards=2, tick=6))
    b.start_received(Start(shard="1", shards=2, tick=4))  # a tick passed already: nothing to begin
    b.start_received(Start(shard="7", shards=2, tick=7))  # not a shard of the run
    assert b.starts(6) and not b.starts(4) and not b.starts(7)
    assert decode_barrier(encode_barrier(b.start(8))) == Start(shard="0", shards=2, tick=8) and b.starts(8)
    b.finish(5)
    b.done_received(TickDone(shard="1", shards=2, tick=5, batches={}))
    b.advance(5)
    b.finish(6)
    b.done_received(TickDone(shard="1", shards=2, tick=6, batches={}))
    b.advance(6)
    assert not b.starts(6) and b.starts(8)
    assert not b.kept(0), "a Start is not kept for re-sending"
    untrusted = Barrier("0", ["0", "1"], lambda t: False, trusted=False)
    untrusted.start_received(Start(shard="1", shards=3, tick=1))  # anyone may forge one: counted, never a conflict
    assert untrusted.conflict is None and untrusted.ignored_conflicts == 1 and not untrusted.starts(1)


def test_a_peer_with_another_shard_count_is_named_not_waited_for() -> None:
    b = Barrier("0", ["0", "1"], lambda t: True)
    b.done_received(TickDone(shard="1", shards=3, tick=0, batches={}))
    assert b.awaited(0) == ["shard 0", "shard 1"]
    assert b.conflict is not None and "shard 1 runs as 1/3, this one as 0/2" in b.conflict


def test_a_shard_outside_the_run_is_refused() -> None:
    with pytest.raises(ValueError, match="not one of"):
        Barrier("3", ["0", "1"], lambda t: True)


_Msg = tuple[int, str, bytes | None, tuple[str, int, int] | None]  # (to, topic, barrier payload, batch key)


class BarrierModel(RuleBasedStateMachine):
    """Shards exchange batches and TickDones through a lossy, reordering 'broker'."""

    @initialize(n=st.integers(1, 3))
    def start(self, n: int) -> None:
        self.n = n
        self.names = [str(i) for i in range(n)]
        self.routes = [routes_for(i, n) for i in range(n)]
        self.barriers = [self._barrier(i, 0) for i in range(n)]
        self.next_tick = [0] * n
        self.finished = [False] * n
        self.committed: list[int | None] = [None] * n
        self.stored_kept: list[list[tuple[int, str, bytes]]] = [[] for _ in range(n)]
        self.sent: dict[int, dict[int, dict[str, int]]] = {}
        self.delivered: list[set[tuple[str, int, str]]] = [set() for _ in range(n)]
        self.network: list[_Msg] = []
        self.passes = 0

    def _barrier(self, i: int, tick: int) -> Barrier:
        routes = self.routes[i]
        return Barrier(str(i), self.names, lambda t: t in routes, tick=tick)

    def _publish(self, sender: int, topic: str, payload: bytes) -> None:
        """Fan a message out to every shard subscribed to it."""
        if topic.startswith("barrier/"):
            for to in range(self.n):
                self.network.append((to, topic, payload, None))
            return
        shard, tick, count = msgspec.msgpack.decode(payload)
        for to in range(self.n):
            if topic in self.routes[to]:
                self.network.append((to, topic, None, (shard, tick, count)))

    def _resend(self, i: int, since: int) -> None:
        for topic, payload in self.barriers[i].kept(since):
            self._publish(i, topic, payload)

    @rule(data=st.data())
    @precondition(lambda self: any(not f and t < 6 for f, t in zip(self.finished, self.next_tick, strict=True)))
    def finish_tick(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from([k for k in range(self.n) if not self.finished[k] and self.next_tick[k] < 6]))
        tick = self.next_tick[i]
        first = self.sent.setdefault(tick, {}).get(i)
        if first is None:  # a re-run of a tick after a crash publishes what the first run did
            topics = data.draw(st.lists(st.sampled_from(TOPICS), unique=True))
            first = self.sent[tick][i] = {t: data.draw(st.integers(0, 3)) for t in sorted(topics)}
        b = self.barriers[i]
        for topic, count in first.items():
            payload = msgspec.msgpack.encode([str(i), tick, count])
            b.keep(tick, topic, payload, events=count)
            self._publish(i, topic, payload)
        done = encode_barrier(b.finish(tick))
        b.keep(tick, f"barrier/{i}", done)
        self._publish(i, f"barrier/{i}", done)
        self.finished[i] = True

    @rule(data=st.data(), duplicate=st.booleans())
    @precondition(lambda self: self.network)
    def deliver(self, data: st.DataObject, duplicate: bool) -> None:
        k = data.draw(st.integers(0, len(self.network) - 1))
        to, topic, payload, key = self.network[k] if duplicate else self.network.pop(k)
        b = self.barriers[to]
        if key is not None:
            shard, tick, count = key
            self.delivered[to].add((shard, tick, topic))
            b.batch_received(shard, tick, topic, count)
            return
        assert payload is not None
        message = decode_barrier(payload)
        if isinstance(message, TickDone):
            b.done_received(message)
        elif message.shard != str(to):
            self._resend(to, message.tick)

    @rule(data=st.data())
    @precondition(lambda self: self.network)
    def deliver_everything_to(self, data: st.DataObject) -> None:
        """One shard gets all that is in flight for it, in a random order (a fast link)."""
        to = data.draw(st.sampled_from(sorted({m[0] for m in self.network})))
        mine = [m for m in self.network if m[0] == to]
        self.network = [m for m in self.network if m[0] != to]
        for m in data.draw(st.permutations(mine)):
            self.network.insert(0, m)
            self.deliver_first()

    @rule(data=st.data())
    @precondition(lambda self: any(self._can_pass(i) for i in range(self.n)))
    def pass_barrier(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from([k for k in range(self.n) if self._can_pass(k)]))
        tick = self.next_tick[i]
        assert set(self.sent.get(tick, {})) == set(range(self.n)), "passed before every shard finished"
        # every shard sent its TickDone for `tick` after committing tick - 1, and commits last
        assert all((c if c is not None else -1) >= tick - 1 for c in self.committed), "a shard ran ahead"
        for shard, batches in self.sent[tick].items():
            for topic in batches:
                if topic in self.routes[i]:
                    assert (str(shard), tick, topic) in self.delivered[i], f"passed without {shard}'s {topic}"
        self.barriers[i].advance(tick)
        self.passes += 1
        self.committed[i] = tick
        self.stored_kept[i] = self.barriers[i].kept_by_tick()
        self.next_tick[i] = tick + 1
        self.finished[i] = False

    def _can_pass(self, i: int) -> bool:
        return self.finished[i] and self.barriers[i].passed(self.next_tick[i])

    @rule()
    def broker_restart(self) -> None:
        """Everything in flight is lost; each shard re-sends what it keeps and joins again."""
        self.network.clear()
        for i in range(self.n):
            self._resend(i, 0)
            join = encode_barrier(self.barriers[i].join())
            self._publish(i, f"barrier/{i}", join)

    @rule(data=st.data())
    def crash_and_resume(self, data: st.DataObject) -> None:
        """kill -9: memory and undelivered mail are lost; the store has the last commit."""
        i = data.draw(st.integers(0, self.n - 1))
        self.network = [m for m in self.network if m[0] != i]
        self.delivered[i] = set()
        c = self.committed[i]
        if c is None:
            self.barriers[i] = self._barrier(i, 0)
            self.next_tick[i], self.finished[i] = 0, False
        else:
            b = self.barriers[i] = self._barrier(i, c)
            for tick, topic, payload in self.stored_kept[i]:
                b.keep(tick, topic, payload)
            self.next_tick[i], self.finished[i] = c, True  # re-pass the barrier of the committed tick
        self._resend(i, 0)  # as after any (re)connection: everything kept, then a Join
        self._publish(i, f"barrier/{i}", encode_barrier(self.barriers[i].join()))

    def teardown(self) -> None:
        """Faults stop: deliver everything, run on; every shard reaches the horizon."""
        for _ in range(10_000):
            progressed = False
            while self.network:
                self.deliver_first()
                progressed = True
            for i in range(self.n):
                if self._can_pass(i):
                    tick = self.next_tick[i]
                    self.barriers[i].advance(tick)
                    self.committed[i], self.next_tick[i], self.finished[i] = tick, tick + 1, False
                    progressed = True
                if not self.finished[i] and self.next_tick[i] < 6:
                    self.finish_fixed(i)
                    progressed = True
            if not progressed:
                break
        assert self.next_tick == [6] * self.n, (self.next_tick, [b.awaited(b.tick) for b in self.barriers])

    def deliver_first(self) -> None:
        to, topic, payload, key = self.network.pop(0)
        b = self.barriers[to]
        if key is not None:
            self.delivered[to].add((key[0], key[1], topic))
            b.batch_received(key[0], key[1], topic, key[2])
        elif payload is not None:
            message = decode_barrier(payload)
            if isinstance(message, TickDone):
                b.done_received(message)
            elif message.shard != str(to):
                self._resend(to, message.tick)

    def finish_fixed(self, i: int) -> None:
        tick = self.next_tick[i]
        batches = self.sent.setdefault(tick, {}).setdefault(i, {TOPICS[0]: 1})
        b = self.barriers[i]
        for topic, count in batches.items():
            payload = msgspec.msgpack.encode([str(i), tick, count])
            b.keep(tick, topic, payload, events=count)
            self._publish(i, topic, payload)
        done = encode_barrier(b.finish(tick))
        b.keep(tick, f"barrier/{i}", done)
        self._publish(i, f"barrier/{i}", done)
        self.finished[i] = True


TestBarrierModel = BarrierModel.TestCase


def test_a_peer_keeps_what_a_shard_killed_before_its_commit_still_needs() -> None:
    """Shard 1 sends its TickDone for t+1, shard 0 passes t+1, shard 1 dies before committing
    t+1: resumed from t, it needs shard 0's messages of t again, and gets them."""
    b0 = Barrier("0", ["0", "1"], lambda t: False)
    for tick in (0, 1):
        b0.keep(tick, "barrier/0", f"done {tick}".encode())
        b0.finish(tick)
        b0.done_received(TickDone(shard="1", shards=2, tick=tick, batches={}))
        b0.advance(tick)  # shard 1 committed 0, then sent its TickDone for 1 and was killed
    assert b0.kept(Join(shard="1", shards=2, tick=0).tick) == [("barrier/0", b"done 0"), ("barrier/0", b"done 1")]
