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


def test_a_shared_subscription_hands_each_message_to_one_member_in_turn_and_no_retained_one() -> None:
    broker = LocalBroker()
    broker.publish("t/kept", b"old", retain=True)
    got: dict[str, list[bytes]] = {"a": [], "b": [], "plain": []}

    async def main() -> None:
        async def member(name: str, filters: list[str], joined: asyncio.Event) -> None:
            async def session(link: Link) -> None:
                await link.subscribe(filters)
                joined.set()
                async for _, payload, _ in link.messages():
                    got[name].append(payload)
                    if payload == b"end":
                        return

            await broker.transport().run(session)

        joined = [asyncio.Event() for _ in range(3)]
        async with asyncio.TaskGroup() as group:
            group.create_task(member("a", ["$share/g/t/+"], joined[0]))
            group.create_task(member("b", ["$share/g/t/+"], joined[1]))
            group.create_task(member("plain", ["t/+"], joined[2]))
            for event in joined:
                await event.wait()
            for n in range(4):
                broker.publish("t/x", str(n).encode())
            for _ in range(2):
                broker.publish("t/x", b"end")

    asyncio.run(main())
    assert got["a"] == [b"0", b"2", b"end"] and got["b"] == [b"1", b"3", b"end"]
    assert got["plain"] == [b"old", b"0", b"1", b"2", b"3", b"end"]
