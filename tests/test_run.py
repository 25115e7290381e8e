"""Runs of whole shards against a real Mosquitto: answers, outside clients, shards, junk, determinism."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiomqtt
import pytest

from sim import broker as broker_module
from sim.scenario import load_scenario
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, run
from sim.wire import topics
from sim.wire.events import decode_say
from tests.helpers import VILLAGE, MosquittoProcess, SmallNpc, ended, eventually, small_world, start_npcsim

pytestmark = pytest.mark.mosquitto


def assert_every_input_answered(stats: RunStats) -> None:
    """Every scripted line said early enough for its answer (the next tick) to fit in the run is answered."""
    script = [(p.id, line) for p in load_scenario(VILLAGE).players for line in p.script if line.tick < stats.tick]
    answers = [(s.agent, s.to, s.tick) for s in stats.dialogue]
    assert script
    for player, line in script:
        assert (line.to, player, line.tick + 1) in answers, f"no answer to {line.text!r}"


async def test_village_answers_every_scripted_input(mosquitto: MosquittoProcess) -> None:
    said: list[tuple[str, bytes]] = []

    async def listen(ready: asyncio.Event) -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe("npcsim/v1/agent/+/say", qos=1)
            ready.set()
            async for message in client.messages:
                said.append((message.topic.value, bytes(message.payload)))  # type: ignore[arg-type]

    ready = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        listener = group.create_task(listen(ready))
        await ready.wait()
        stats = await run(RunConfig(
            scenario=VILLAGE, run_id="v1", ticks=16, broker=BrokerConfig(url=mosquitto.url),
            record=RecordConfig(keep_dialogue=True),
        ))
        await eventually(lambda: len(said) >= stats.lines, what=f"the {stats.lines} lines said, heard")
        listener.cancel()
    assert_every_input_answered(stats)
    for topic, payload in said:
        say = decode_say(payload)
        assert topic == topics.agent_say("v1", say.agent)
    assert {decode_say(p).to for _, p in said} >= {"player", "snack_machine"}


async def test_outside_client_talks_to_an_npc(mosquitto: MosquittoProcess) -> None:
    stop = asyncio.Event()
    ready = asyncio.Event()
    config = RunConfig(scenario=VILLAGE, run_id="v2", ticks=500, tick_ms=20, broker=BrokerConfig(url=mosquitto.url))
    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stop=stop, on_ready=lambda _: ready.set()))
        await ready.wait()
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(topics.agent_say("v2", "innkeeper"), qos=1)
            await client.publish(
                topics.player_input("v2", "visitor"), b'{"to": "innkeeper", "text": "A room, please."}', qos=1
            )
            async with asyncio.timeout(10):
                async for message in client.messages:
                    say = decode_say(bytes(message.payload))  # type: ignore[arg-type]
                    if say.to == "visitor":
                        break
        stop.set()
        stats = await job
    assert say.agent == "innkeeper" and say.text and say.inference_id
    assert stats.tick < 499


async def test_malformed_payloads_leave_the_run_going(mosquitto: MosquittoProcess) -> None:
    ready = asyncio.Event()
    config = RunConfig(
        scenario=VILLAGE, run_id="v3", ticks=20, tick_ms=30, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(keep_dialogue=True),
    )
    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, on_ready=lambda _: ready.set()))
        await ready.wait()
        scenario = load_scenario(VILLAGE)
        targets = [topics.location_events("v3", loc.id) for loc in scenario.locations]
        targets += [topics.agent_inbox("v3", npc.id) for npc in scenario.npcs]
        targets += [topics.player_input("v3", "troll")]
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            for topic in targets:
                for junk in (b"", b"\xc1", b"{not json", b'{"to": "nobody", "text": "x"}', os.urandom(64)):
                    await client.publish(topic, junk, qos=1)
        stats = await job
    assert stats.tick == 19
    assert set(stats.bus.malformed) >= {"location events", "inbox", "player input", "player input to an unknown NPC"}
    assert_every_input_answered(stats)


async def test_same_seed_gives_identical_dialogue(mosquitto: MosquittoProcess) -> None:
    runs = []
    for run_id in ("d1", "d1"):
        config = RunConfig(
            scenario=VILLAGE, run_id=run_id, ticks=20, seed=3, broker=BrokerConfig(url=mosquitto.url),
            record=RecordConfig(keep_dialogue=True),
        )
        stats = await run(config)
        runs.append([(s.tick, s.agent, s.to, s.text, s.inference_id) for s in stats.dialogue])
    assert runs[0] == runs[1]
    assert len(runs[0]) > 7
    assert sorted(runs[0]) == sorted(set(runs[0]))


async def test_embedded_broker_runs_the_village(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_module, "find_mosquitto", lambda: None)
    stats = await run(RunConfig(
        scenario=VILLAGE, run_id="emb", ticks=15, broker=BrokerConfig(url="auto"),
        record=RecordConfig(keep_dialogue=True),
    ))
    assert stats.broker.startswith("embedded")
    assert_every_input_answered(stats)


TWO = small_world("two", [SmallNpc("a", ambient_chance=1.0), SmallNpc("b")],
                  scripts={"p": [(2, "b", "Hello from another shard.")]})


async def test_two_shard_processes_share_a_run(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    scenario = tmp_path / "two.toml"
    scenario.write_text(TWO)
    said = []

    async def shard(i: int, ticks: int) -> asyncio.subprocess.Process:
        return await start_npcsim(
            "run", str(scenario), "--broker", mosquitto.url, "--run-id", "two", "--shard", f"{i}/2",
            "--ticks", str(ticks), "--tick-ms", "50", "--quiet", stdout=asyncio.subprocess.DEVNULL,
        )

    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
        await client.subscribe("npcsim/two/status/1", qos=1)
        await client.subscribe("npcsim/two/agent/+/say", qos=1)
        # Shard 1 (b) first, until it listens; it waits at tick 0 for shard 0 (the tick barrier),
        # whose player speaks to b at tick 2. Both run the same 40 ticks, in step.
        procs = [await shard(1, 40)]
        try:
            async with asyncio.timeout(30):
                async for message in client.messages:
                    if message.topic.value.endswith("/status/1") and b'"online"' in bytes(message.payload):  # type: ignore[arg-type]
                        break
            procs.insert(0, await shard(0, 40))
            async with asyncio.timeout(30):
                async for message in client.messages:
                    if "/status/" in message.topic.value:
                        continue
                    said.append(decode_say(bytes(message.payload)))  # type: ignore[arg-type]
                    heard = {(s.agent, s.to) for s in said}
                    if ("b", "a") in heard and ("b", "p") in heard:
                        break
        finally:
            ends = [await ended(proc, within=15) for proc in procs]
    for end in ends:
        assert end.code == 0, end.err
    assert any(s.agent == "a" and s.to == "b" for s in said)
