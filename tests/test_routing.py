"""Routing, mailboxes, de-duplication, bounds and the run key: sans-I/O, no broker."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.protocol.bounds import InputBounds
from sim.protocol.mailbox import Mailbox, Overflow, event_source
from sim.protocol.received import BarrierReceived, BatchArrived, InputRefused, OutsideReceived
from sim.protocol.router import Router
from sim.protocol.seal import RunKey
from sim.wire import topics
from sim.wire.barrier import Join, TickDone, encode_barrier
from sim.wire.events import (
    ErrorMessage,
    EventBatch,
    Notice,
    PlayerInputMessage,
    Speech,
    WorldStateMessage,
    encode_batch,
)

LOC = "npcsim/r/loc/square/events"
INBOX = "npcsim/r/agent/snack/inbox"


def router(**kw: object) -> Router:
    r = Router("r", "0", mailbox_size=kw.pop("mailbox_size", 100), seen_events=1000,  # type: ignore[arg-type]
               bounds=InputBounds(), **kw)  # type: ignore[arg-type]
    r.route_location(LOC, "square", 2)
    r.route_inboxes(["snack"])
    r.route("player-input")
    r.route("world-state")
    r.route_barrier()
    return r


def batch(*events: Speech | Notice, shard: str = "0", tick: int = 0) -> bytes:
    return encode_batch(EventBatch(shard=shard, tick=tick, events=events))


def line(n: int, speaker: str = "guard_captain", text: str | None = None) -> Speech:
    return Speech(id=f"r:{speaker}:1:{n}", tick=1, speaker=speaker, text=text or f"real line {n}", location="square")


def at_the_square(r: Router, up_to: int = 99) -> list[str]:
    """The texts of the events the square's log takes next."""
    return [e.text for place, events in r.mail.take_place_events(up_to) for e in events if place == "square"]


def test_a_forged_event_with_a_future_id_does_not_silence_the_real_one() -> None:
    r = router()
    forged = Notice(id=line(1).id, tick=1, text="The king has returned alive")
    r.receive(LOC, batch(forged, shard="evil"))
    r.receive(LOC, batch(line(1)))
    r.receive(LOC, batch(line(1)))  # a QoS 1 redelivery of the real one
    texts = at_the_square(r)
    assert "real line 1" in texts and texts.count("real line 1") == 1
    assert r.stats.duplicates == 1


def test_a_flooding_source_loses_its_own_excess_not_the_others_events() -> None:
    r = router(mailbox_size=5)
    r.receive(INBOX, batch(line(0, "bob")))
    r.receive(INBOX, batch(*(line(n, "flooder") for n in range(50))))
    r.receive(INBOX, batch(line(1, "alice")))
    speakers = [e.speaker for e in r.mail.mailbox("snack").drain() if isinstance(e, Speech)]
    assert "bob" in speakers and "alice" in speakers and len(speakers) == 5
    assert r.stats.mailbox_overflow == 47
    report = r.stats.overflow.take()
    assert report == {"snack": (47, "flooder")}
    assert r.stats.overflow.take() == {}


def test_outside_input_over_its_bounds_is_refused_and_counted() -> None:
    r = router()
    got = [
        r.receive("npcsim/r/player/alice/input", json.dumps({"to": "snack", "text": "x" * 501}).encode()),
        r.receive("npcsim/r/player/alice/input", json.dumps({"to": "snack", "text": "hello"}).encode()),
        r.receive("npcsim/r/world/state", json.dumps({"state": {"king": "v" * 1_000_000}}).encode()),
        r.receive("npcsim/r/world/state", json.dumps({"state": {f"k{i}": "v" for i in range(20_000)}}).encode()),
        r.receive("npcsim/r/world/state", json.dumps({"state": {"king": "dead"}}).encode()),
    ]
    assert [(g.error.code, g.player, g.npc) if isinstance(g, InputRefused) else g for g in got] == [
        ("too_long", "alice", "snack"),
        OutsideReceived("player-input", "alice", PlayerInputMessage(to="snack", text="hello")),
        ("too_long", None, None),
        ("too_long", None, None),
        OutsideReceived("world-state", "", WorldStateMessage(state={"king": "dead"})),
    ]
    assert r.stats.refused == {"player input too long": 1, "world state over its bounds": 2}


@pytest.mark.parametrize("player", ["bad name", "x" * 200, "é"])
def test_a_player_id_that_is_not_a_name_is_malformed(player: str) -> None:
    r = router()
    refused = r.receive(f"npcsim/r/player/{player}/input", b'{"to": "snack", "text": "hi"}')
    assert isinstance(refused, InputRefused) and (refused.error.code, refused.player) == ("schema", player)
    assert r.stats.malformed == {"player input": 1}


def test_with_a_run_key_unsigned_and_badly_signed_batches_are_dropped_and_counted() -> None:
    key = RunKey(b"k" * 32)
    r = router(run_key=key)
    forged = batch(Notice(id="x", tick=1, text="The king has returned alive"), shard="evil")
    r.receive(LOC, forged)
    r.receive(LOC, RunKey(b"z" * 32).sign(LOC, forged))
    r.receive(LOC, key.sign(INBOX, forged))  # signed for another topic
    r.receive(LOC, key.sign(LOC, batch(line(1))))
    assert at_the_square(r) == ["real line 1"]
    assert r.stats.refused == {"unsigned internal message": 3}
    assert "k" * 32 not in repr(key)


def test_batches_and_barrier_messages_come_back_as_events() -> None:
    r = router()
    done = TickDone(shard="1", shards=2, tick=2, batches={LOC: 2})
    got = [
        r.receive(LOC, batch(line(1), line(2), tick=2)),
        r.receive(topics.barrier("r", "1"), encode_barrier(done)),
        r.receive(topics.barrier("r", "0"), encode_barrier(done)),  # on another shard's topic
        r.receive(topics.barrier("r", "1"), b"\xc1"),
    ]
    assert got == [BatchArrived("0", 2, LOC, 2), BarrierReceived(done), None, None]
    assert r.stats.malformed == {"barrier": 2}


def test_mailboxes_and_places_hold_events_of_later_ticks_back() -> None:
    r = router()
    for tick in (3, 2):
        event = Speech(id=f"r:x:{tick}:1", tick=tick, speaker="x", to="snack", text="hello")
        r.receive(INBOX, batch(event, tick=tick))
        r.receive(LOC, batch(msgspec.structs.replace(event, id=f"r:x:{tick}:2", location="square"), tick=tick))
    box = r.mail.mailbox("snack")
    assert box.has_mail(3) and not box.has_mail(2)
    assert r.mail.mail_holders(3) == ["snack"] and r.mail.mail_holders(2) == []
    assert [e.tick for e in box.drain(3)] == [2]
    assert not box.has_mail(3) and box.has_mail(4)
    assert [e.tick for e in r.mail.take_mail("snack", 4)] == [3]
    assert r.mail.mail_holders(99) == [] and r.mail.take_mail("snack", 99) == []  # an emptied mailbox is gone
    assert [(place, [e.tick for e in events]) for place, events in r.mail.take_place_events(2)] == [("square", [2])]
    assert [(place, [e.tick for e in events]) for place, events in r.mail.take_place_events(3)] == [("square", [3])]
    assert r.mail.take_place_events(99) == []


@given(
    size=st.integers(min_value=2, max_value=30),
    order=st.lists(st.sampled_from(["flooder", "alice", "bob", "(notice)"]), max_size=300),
)
def test_a_full_mailbox_drops_only_the_flooders_excess(size: int, order: list[str]) -> None:
    """Whatever the interleaving: the box never exceeds its size, every event is kept or counted,
    and while the others hold less than half of it, none of theirs is dropped."""
    overflow = Overflow()
    box = Mailbox("m", size, overflow)
    others_put = 0
    for n, source in enumerate(order):
        event: Speech | Notice = (Notice(id=f"n{n}", tick=0, text="x") if source == "(notice)"
                                  else Speech(id=f"s{n}", tick=0, speaker=source, text="x"))
        others_put += source != "flooder"
        box.put(event)
        assert len(box) <= size
    kept = box.drain()
    assert len(kept) + overflow.total == len(order)
    if others_put < size / 2:
        assert sum(1 for e in kept if event_source(e) != "flooder") == others_put


def test_with_a_run_key_barrier_messages_must_be_signed_for_their_topic() -> None:
    key = RunKey(b"k" * 32)
    r = router(run_key=key)
    done = encode_barrier(TickDone(shard="1", shards=2, tick=0, batches={}))
    topic = topics.barrier("r", "1")
    got = [
        r.receive(topic, done),  # unsigned: a forged "tick done" could release the barrier early
        r.receive(topic, key.sign(topics.barrier("r", "0"), done)),  # signed for another topic
        r.receive(topic, key.sign(topic, done)),
    ]
    assert [type(g).__name__ for g in got] == ["NoneType", "NoneType", "BarrierReceived"]
    assert r.stats.refused == {"unsigned internal message": 2}


def test_a_re_sent_batch_of_a_tick_already_perceived_is_counted_not_delivered() -> None:
    r = router()
    r.drop_batches_before(5)
    old = Speech(id="r:x:4:1", tick=4, speaker="x", text="old news", location="square")
    new = Speech(id="r:x:5:1", tick=5, speaker="x", text="news", location="square")
    got = [r.receive(LOC, batch(old, tick=4)), r.receive(LOC, batch(new, tick=5))]
    assert at_the_square(r) == ["news"]
    assert r.stats.stale_batches == 1
    assert got == [BatchArrived("0", 4, LOC, 1), BatchArrived("0", 5, LOC, 1)]  # the barrier still hears of both


def test_each_kind_of_message_gives_its_event_and_junk_gives_none() -> None:
    r = router()
    join = Join(shard="2", shards=3, tick=7)
    cases = [
        (LOC, batch(line(1), tick=1, shard="2"), BatchArrived("2", 1, LOC, 1)),
        (INBOX, batch(line(2), line(3), tick=1), BatchArrived("0", 1, INBOX, 2)),
        (topics.barrier("r", "2"), encode_barrier(join), BarrierReceived(join)),
        ("npcsim/r/player/bob/input", b'{"to": "guard", "text": "hi"}',
         OutsideReceived("player-input", "bob", PlayerInputMessage(to="guard", text="hi"))),
        ("npcsim/r/world/state", b'{"state": {"gate": "open"}}',
         OutsideReceived("world-state", "", WorldStateMessage(state={"gate": "open"}))),
        ("npcsim/r/agent/someone_elses/inbox", batch(line(4)), None),  # another shard's agent: silently not ours
    ]
    for topic, payload, expected in cases:
        assert r.receive(topic, payload) == expected, topic
    assert r.stats.malformed == {}
    for topic in (LOC, INBOX, topics.barrier("r", "2"), "npcsim/r/nowhere"):
        assert r.receive(topic, b"\xc1{") is None, topic
    for topic, player in (("npcsim/r/player/bob/input", "bob"), ("npcsim/r/world/state", None)):
        assert r.receive(topic, b"\xc1{") == InputRefused(  # the client is told
            ErrorMessage(code="not_json", message="JSON is malformed: invalid character (byte 0)", topic=topic),
            player=player)
    assert r.stats.malformed == {"location events": 1, "inbox": 1, "barrier": 1, "player input": 1, "world state": 1,
                                 "unrouted": 1}


def test_player_input_world_state_and_barrier_topics_are_routed_only_when_configured() -> None:
    r = Router("r", "0", mailbox_size=10, seen_events=10, bounds=InputBounds())
    assert r.receive("npcsim/r/player/bob/input", b'{"to": "guard", "text": "hi"}') is None
    assert r.receive("npcsim/r/world/state", b'{"state": {}}') is None
    assert r.receive(topics.barrier("r", "1"), encode_barrier(Join(shard="1", shards=2, tick=0))) is None
    assert r.stats.malformed == {"unrouted": 3}
    assert (r.route("player-input"), r.route("world-state"), r.route_barrier()) == (
        "npcsim/r/player/+/input", "npcsim/r/world/state", topics.barrier_all("r")
    )
    assert r.receive("npcsim/r/player/bob/input", b'{"to": "guard", "text": "hi"}') == OutsideReceived(
        "player-input", "bob", PlayerInputMessage(to="guard", text="hi"))


def test_own_events_are_delivered_from_the_objects_and_counted_apart() -> None:
    r = router()
    said = [line(1), line(2)]
    to_snack = Speech(id="r:p:1:0", tick=1, speaker="p", to="snack", text="for you", from_player=True)
    r.deliver(LOC, said)
    r.deliver(INBOX, [to_snack])
    r.receive(LOC, batch(line(1)))  # the same event back through a broker: a duplicate
    assert at_the_square(r) == ["real line 1", "real line 2"]
    assert r.mail.take_mail("snack", 2) == [to_snack]
    assert (r.stats.events_local, r.stats.events_in, r.stats.duplicates) == (3, 1, 1)
    assert r.stats.events_delivered == 2 * 2 + 1  # a place's event is heard by its 2 NPCs
    with pytest.raises(ValueError, match="not routed here"):
        r.deliver("npcsim/r/agent/someone_elses/inbox", [to_snack])


def test_the_mail_waiting_at_a_commit_comes_back_on_resume() -> None:
    r = router()
    early = Speech(id="r:p:1:0", tick=1, speaker="p", to="snack", text="now", from_player=True)
    late = Speech(id="r:p:2:0", tick=2, speaker="p", to="snack", text="next tick", from_player=True)
    r.deliver(INBOX, [late, early])
    waiting = r.mail.waiting_mail(1)  # committed with tick 1: the tick-2 event is re-sent by its shard instead
    assert waiting == [("snack", early)]
    resumed = router()
    resumed.mail.restore_mail(waiting)
    resumed.receive(INBOX, batch(early, tick=1))  # and a re-send of it is a duplicate
    assert resumed.mail.mail_holders(2) == ["snack"] and resumed.mail.take_mail("snack", 2) == [early]
    assert resumed.stats.duplicates == 1
