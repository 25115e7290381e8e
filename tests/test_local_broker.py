"""sim.mqtt.LocalBroker: buses in one process, with MQTT's matching, in publish order, retained kept."""

from __future__ import annotations

import asyncio

import aiomqtt
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.mqtt import Link, LocalBroker

LEVEL = st.sampled_from(["a", "b", "c", ""])
TOPIC = st.lists(LEVEL, min_size=1, max_size=4).map("/".join).filter(bool)
FILTER = st.lists(st.sampled_from(["a", "b", "c", "", "+"]), min_size=1, max_size=4).flatmap(
    lambda levels: st.sampled_from(["/".join(levels), "/".join([*levels, "#"]), "#"])).filter(bool)


def received(filters: list[str], published: list[tuple[str, bool]]) -> list[tuple[str, bytes, bool]]:
    """What one subscriber with `filters` gets of `published` (topic, retain), in order."""
    broker = LocalBroker()
    got: list[tuple[str, bytes, bool]] = []

    async def session(link: Link) -> None:
        await link.subscribe(["end", *filters])
        for n, (topic, retain) in enumerate(published):
            broker.publish(topic, str(n).encode(), retain=retain)
        broker.publish("end", b"")
        async for message in link.messages():
            if message[0] == "end":
                return
            got.append(message)

    asyncio.run(broker.transport().run(session, on_lost=lambda: None))
    return got


@settings(max_examples=200, deadline=None)
@given(st.lists(FILTER, min_size=1, max_size=3), st.lists(TOPIC, min_size=1, max_size=6))
def test_a_subscriber_gets_what_mqtt_matches_in_publish_order(filters: list[str], topics: list[str]) -> None:
    got = received(filters, [(t, False) for t in topics])
    expected = [(t, str(n).encode(), False) for n, t in enumerate(topics)
                if any(aiomqtt.Topic(t).matches(f) for f in filters)]
    assert got == expected


def test_retained_messages_reach_later_subscribers_and_an_empty_one_clears() -> None:
    broker = LocalBroker()
    broker.publish("w/state", b"old", retain=True)
    broker.publish("w/state", b"new", retain=True)
    broker.publish("w/gone", b"x", retain=True)
    broker.publish("w/gone", b"", retain=True)
    got: list[tuple[str, bytes, bool]] = []

    async def session(link: Link) -> None:
        await link.subscribe(["w/#"])
        broker.publish("w/live", b"now")
        async for message in link.messages():
            got.append(message)
            if message[0] == "w/live":
                return

    asyncio.run(broker.transport().run(session, on_lost=lambda: None))
    assert got == [("w/state", b"new", True), ("w/live", b"now", False)]
    assert broker.links == []  # the session's end is its link's
