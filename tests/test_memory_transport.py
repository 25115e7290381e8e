"""The in-memory broker stands in for every MQTT user: the run-nonce handshake, the inference
link (pool <-> remote worker), the live view and `subscribe` here, without Mosquitto (the
bus: tests/memory_shard.py)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from sim.bus import BusConfig, open_bus
from sim.cli._terminal import Out
from sim.cli.subscribe import _subscribe
from sim.errors import ConfigError
from sim.inference import Pool, PoolConfig, RemoteWorker, WorkerConfig
from sim.inference._counters import Counters
from sim.inference._link import open_mqtt_dispatch
from sim.inference.backends.scripted import scripted_reply
from sim.mqtt import BrokerAddress
from sim.output import clean_line, load_fact_guard
from sim.protocol.received import BarrierReceived
from sim.protocol.seal import RunKey, new_nonce
from sim.shard import SystemClock, VirtualClock
from sim.shard._instance import learn_run_nonce
from sim.view import LiveFeed, RunModel
from sim.wire import topics
from sim.wire.barrier import Hello, Welcome
from sim.wire.events import (
    IntentMessage,
    PlayerInputMessage,
    SayMessage,
    WorldStateMessage,
    decode_intent,
    encode_json,
)
from tests.helpers import eventually
from tests.inference_helpers import make_request, running
from tests.memory_broker import MemoryBroker


@asynccontextmanager
async def serving(broker: MemoryBroker) -> AsyncIterator[MemoryBroker]:
    async with asyncio.TaskGroup() as group:
        task = group.create_task(broker.serve())
        yield broker
        task.cancel()


async def _learn_from_shard_0(shards_there: int) -> bytes:
    """Shard 1 asks over the memory broker; a bus playing shard 0 (of `shards_there` shards) answers."""
    clock = VirtualClock(autojump=0.005)
    key, nonce = RunKey.generate(), new_nonce()
    config = BusConfig(broker=BrokerAddress(), run="mem", shard="0", run_key=key.for_run(nonce))
    async with serving(MemoryBroker(seed=5, clock=clock)) as broker, \
            open_bus(config, transport=broker.transport()) as shard_0, asyncio.TaskGroup() as group:
        await shard_0.listen_barrier()
        learning = group.create_task(learn_run_nonce(
            BrokerAddress(), key, run_id="mem", shard="1", shards=2, clock=clock, transport=broker.transport()))
        hellos: list[Hello] = []
        while not hellos:
            await clock.wait(shard_0.arrived, 5.0)
            hellos = [e.message for e in shard_0.take_events()
                      if isinstance(e, BarrierReceived) and isinstance(e.message, Hello)]
        await shard_0.publish_barrier(
            Welcome(shard="0", shards=shards_there, challenge=hellos[0].challenge, nonce=nonce.hex()))
        learned = await learning
    assert learned == nonce
    return learned


async def test_a_shard_learns_the_run_nonce_from_shard_0_over_the_memory_broker() -> None:
    await _learn_from_shard_0(shards_there=2)


async def test_a_shard_count_that_differs_from_shard_0s_is_one_error_over_the_memory_broker() -> None:
    with pytest.raises(ExceptionGroup) as caught:
        await _learn_from_shard_0(shards_there=3)
    assert caught.group_contains(ConfigError, match="every shard of a run needs the same count")


async def test_the_pool_and_a_remote_worker_talk_over_the_memory_broker() -> None:
    broker = MemoryBroker(seed=9, clock=SystemClock(), max_delay=0.005)
    key = RunKey.generate().for_run(new_nonce())
    config = PoolConfig(transport="mqtt", run_id="mem", run_key=key, max_in_flight=8)
    worker_config = WorkerConfig(broker=BrokerAddress(), run_id="mem", name="w", concurrency=4,
                                 run_key=RunKey(key.secret))  # a worker's key has no run nonce
    worker = RemoteWorker(worker_config, transport=broker.transport())
    counters = Counters()
    guard = load_fact_guard(config.fact_guard)
    async with serving(broker), running(worker), \
            open_mqtt_dispatch(config, counters, guard, transport=broker.transport()) as dispatch:
        pool = Pool(config, dispatch, counters)
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(pool.infer(make_request(n, agent=f"npc{n}"))) for n in range(12)]
    results = [t.result() for t in tasks]
    assert all(not r.fallback for r in results) and {r.worker for r in results} == {"w"}
    expected = [clean_line(scripted_reply(make_request(n, agent=f"npc{n}").memory), f"npc{n}", 200) for n in range(12)]
    assert [r.line for r in results] == expected
    assert worker.statistics().completed == 12
    sent = [topic for topic, _ in broker.published]
    stopped = topics.infer_worker("mem", "w")  # the worker, stopped, said it is offline
    assert set(sent) == {topics.infer_request("mem"), topics.infer_response("mem", config.shard), stopped}
    assert sent.count(stopped) == 1 and sent[-1] == stopped
    assert len(sent) < 2 * 12  # requests and replies travelled in batches


async def test_the_live_view_follows_and_speaks_over_the_memory_broker() -> None:
    broker = MemoryBroker(seed=2, clock=SystemClock(), max_delay=0.005)
    world = encode_json(WorldStateMessage(state={"king": "dead"}, tick=0))
    broker.publish(topics.world_state("mem"), world, retain=True)
    model = RunModel("mem")
    feed = LiveFeed(model, BrokerAddress(), transport=broker.transport())
    said = encode_json(PlayerInputMessage(to="smith", text="Hello?"))
    async with serving(broker), asyncio.TaskGroup() as group:
        following = group.create_task(feed.run())
        await eventually(lambda: model.world == {"king": "dead"}, what="the retained world state")
        await feed.speak("ann", PlayerInputMessage(to="smith", text="Hello?"))
        following.cancel()
    assert (topics.player_input("mem", "ann"), said) in broker.published


async def test_subscribe_prints_what_npcs_say_over_the_memory_broker() -> None:
    broker = MemoryBroker(seed=4, clock=SystemClock(), max_delay=0.005)
    printed, noted = io.StringIO(), io.StringIO()
    args = argparse.Namespace(run="mem", agent="+", show="lines", json=True)
    say = SayMessage(run="mem", agent="smith", tick=3, to=None, text="Mind the forge.", inference_id="i1")
    async with serving(broker), asyncio.TaskGroup() as group:
        following = group.create_task(_subscribe(BrokerAddress(), args, Out(printed), Out(noted),
                                                 transport=broker.transport()))
        await eventually(lambda: "connected to" in noted.getvalue(), what="the subscription")
        broker.publish(topics.agent_say("mem", "smith"), encode_json(say))
        await eventually(lambda: printed.getvalue().endswith("\n"), what="the line printed")
        following.cancel()
    assert json.loads(printed.getvalue())["text"] == "Mind the forge."


@pytest.mark.parametrize("as_json", [False, True])
async def test_subscribe_shows_intents_and_only_them(as_json: bool) -> None:
    """`npcsim subscribe --intents`: each intent an NPC proposes, as a record (or its JSON); no line said."""
    broker = MemoryBroker(seed=5, clock=SystemClock(), max_delay=0.005)
    printed, noted = io.StringIO(), io.StringIO()
    args = argparse.Namespace(run="mem", agent="+", show="intents", json=as_json)
    intent = IntentMessage(run="mem", agent="innkeeper", tick=12, name="give_item", args={"item": "lantern"},
                           inference_id="mem:innkeeper:12:1", reply_to="q2")
    say = SayMessage(run="mem", agent="innkeeper", tick=12, to="me", text="Here.", inference_id="mem:innkeeper:12:1")
    async with serving(broker), asyncio.TaskGroup() as group:
        following = group.create_task(_subscribe(BrokerAddress(), args, Out(printed), Out(noted),
                                                 transport=broker.transport()))
        await eventually(lambda: "connected to" in noted.getvalue(), what="the subscription")
        broker.publish(topics.agent_say("mem", "innkeeper"), encode_json(say))
        broker.publish(topics.agent_intent("mem", "innkeeper"), encode_json(intent))
        await eventually(lambda: printed.getvalue().endswith("\n"), what="the intent printed")
        following.cancel()
    assert "waiting for intents on npcsim/mem/agent/+/intent" in noted.getvalue()
    if as_json:
        assert decode_intent(printed.getvalue().encode()) == intent
    else:
        assert printed.getvalue() == 'mem t  12 innkeeper intends give_item {"item":"lantern"} (reply_to q2)\n'
