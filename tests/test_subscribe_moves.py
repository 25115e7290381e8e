"""`npcsim subscribe` follows moves on a real Mosquitto: by default it prints where NPCs go
(`agent/+/location`, retained: where each stands first) among the lines they say."""

from __future__ import annotations

import argparse
import asyncio
import io
import json

import aiomqtt
import pytest

from sim.cli._terminal import Out
from sim.cli.subscribe import _subscribe
from sim.mqtt import BrokerAddress
from sim.wire import topics
from sim.wire.events import LocationMessage, SayMessage, encode_json
from tests.helpers import MosquittoProcess, eventually

pytestmark = pytest.mark.mosquitto

RUN = "moves"


async def follow(mosquitto: MosquittoProcess, *, as_json: bool, publish: list[tuple[str, bytes]]) -> list[str]:
    """What `subscribe --run moves` prints (records, one a line) once `publish` was sent after it connected."""
    out, note = io.StringIO(), io.StringIO()
    args = argparse.Namespace(run=RUN, agent="+", show="lines", json=as_json)
    task = asyncio.create_task(_subscribe(BrokerAddress.parse(mosquitto.url), args, Out(out), Out(note)))
    try:
        await eventually(lambda: note.getvalue().startswith("connected to "), what="subscribe to connect")
        assert note.getvalue().rstrip().endswith(f"npcsim/{RUN}/agent/+/say and npcsim/{RUN}/agent/+/location")
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            for topic, payload in publish:
                await client.publish(topic, payload, qos=1)
        return await eventually(lambda: (lines := out.getvalue().splitlines()) and len(lines) >= 3 and lines,
                                what="three records")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_subscribe_prints_where_everyone_is_then_each_move(mosquitto: MosquittoProcess) -> None:
    start = LocationMessage(run=RUN, agent="guard", tick=0, location="square")
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:  # retained before anyone listens
        await client.publish(topics.agent_location(RUN, "guard"), encode_json(start), qos=1, retain=True)
    moved = LocationMessage(run=RUN, agent="smith", tick=8, location="forge", activity="working the bellows")
    said = SayMessage(run=RUN, agent="smith", tick=9, to=None, text="Hot iron!", inference_id="i")
    lines = await follow(mosquitto, as_json=False, publish=[
        (topics.agent_location(RUN, "smith"), encode_json(moved)), (topics.agent_say(RUN, "smith"), encode_json(said)),
    ])
    assert lines == [f"{RUN} t   0 guard -> square", f"{RUN} t   8 smith -> forge (working the bellows)",
                     f"{RUN} t   9 smith: Hot iron!"]


async def test_subscribe_json_gives_each_move_as_it_came_and_says_what_it_cannot_read(
    mosquitto: MosquittoProcess,
) -> None:
    moved = LocationMessage(run=RUN, agent="smith", tick=8, location="forge")
    lines = await follow(mosquitto, as_json=True, publish=[
        (topics.agent_location(RUN, "smith"), encode_json(moved)),
        (topics.agent_location(RUN, "ghost"), b'{"agent": "ghost"}'),
        (topics.agent_say(RUN, "smith"), b"not json"),
    ])
    first, unreadable, bad_say = (json.loads(line) for line in lines)
    assert first == {"run": RUN, "agent": "smith", "tick": 8, "location": "forge", "activity": ""}
    assert unreadable["topic"] == topics.agent_location(RUN, "ghost") and "unreadable" in unreadable
    assert bad_say["topic"] == topics.agent_say(RUN, "smith") and "unreadable" in bad_say
