"""The tick outbox, sans-I/O: events in, one sorted and sealed batch per topic out, with counts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sim.protocol.outbox import Outbox, SealedBatch
from sim.protocol.seal import RunKey
from sim.wire.events import EventBatch, Notice, Speech, decode_batch, encode_batch

LOC = "npcsim/r/loc/square/events"
INBOX = "npcsim/r/agent/snack/inbox"


def speech(tick: int, n: int) -> Speech:
    return Speech(id=f"r:a:{tick}:{n}", tick=tick, speaker="a", text=f"line {n}")


def test_one_batch_per_topic_in_topic_order_events_in_tick_and_id_order() -> None:
    outbox = Outbox("2")
    for event in (speech(5, 3), speech(5, 1), speech(4, 9)):
        outbox.emit(LOC, event)
    outbox.emit(INBOX, speech(5, 2))
    assert len(outbox) == 4
    batches = outbox.flush(5)
    assert [(b.topic, b.events) for b in batches] == [(INBOX, 1), (LOC, 3)]
    sent = decode_batch(batches[1].payload)
    assert (sent.shard, sent.tick) == ("2", 5)
    assert [e.id for e in sent.events] == ["r:a:4:9", "r:a:5:1", "r:a:5:3"]
    assert len(outbox) == 0 and outbox.flush(6) == []


def test_with_a_run_key_every_batch_is_sealed_for_its_own_topic() -> None:
    key = RunKey(b"k" * 32)
    outbox = Outbox("0", key)
    outbox.emit(LOC, Notice(id="n1", tick=0, text="The bell rings"))
    [batch] = outbox.flush(0)
    body = encode_batch(EventBatch(shard="0", tick=0, events=(Notice(id="n1", tick=0, text="The bell rings"),)))
    assert batch == SealedBatch(LOC, key.sign(LOC, body), 1)
    assert key.open(LOC, batch.payload) == body
    assert key.open(INBOX, batch.payload) is None
    assert Outbox("0").flush(0) == []


@given(order=st.permutations(list(range(12))))
def test_the_bytes_do_not_depend_on_the_order_of_emission(order: list[int]) -> None:
    """asyncio's scheduling decides the order agents emit in; it must never reach the payload."""
    events = [speech(n % 3, n) for n in range(12)]
    topics = [LOC, INBOX, LOC, LOC]
    reference, shuffled = Outbox("0"), Outbox("0")
    for n, event in enumerate(events):
        reference.emit(topics[n % 4], event)
    for n in order:
        shuffled.emit(topics[n % 4], events[n])
    assert shuffled.flush(7) == reference.flush(7)
