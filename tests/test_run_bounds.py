"""Run-wide bounds: a flood of players costs a bounded number of inferences and error replies,
and a game cannot give an NPC more facts than it can hold (issue 48's findings 4 and 5).

Found: 5,000 valid inputs from 5,000 player ids made 2,913 inferences, 1,000 of them by the
innkeeper in one tick; 20,000 `game/fact` messages were all taken, every prompt then 4.8
million characters against a 2,000-character budget.
"""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path

import aiomqtt
import pytest

from sim.protocol.bounds import ErrorReplies, InputBounds, limit_player_inputs
from sim.shard import BrokerConfig, Limits, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader
from sim.wire import topics
from sim.wire.contract import message_schema
from sim.wire.events import ErrorMessage, decode_error, decode_say
from sim.wire.inputs import GameFact, OutsideInput
from tests.helpers import VILLAGE, MosquittoProcess, eventually


def said(player: str, to: str = "innkeeper") -> OutsideInput:
    return OutsideInput(player=player, to=to, text="Hello?")


def test_a_tick_takes_each_players_each_npcs_and_the_shards_bounded_share() -> None:
    bounds = InputBounds(player_inputs_per_tick=2, npc_inputs_per_tick=3, inputs_per_tick=5)
    fact = GameFact(npc=None, id="f", text="x")
    arrived = [said("a"), said("a"), said("a"), fact, said("b"), said("c"), said("d", "smith"), said("e", "smith"),
               said("f", "guard")]
    taken, over = limit_player_inputs(arrived, bounds)
    assert [(t.player, t.to) for t in taken if isinstance(t, OutsideInput)] == [
        ("a", "innkeeper"), ("a", "innkeeper"), ("b", "innkeeper"), ("d", "smith"), ("e", "smith")]
    assert fact in taken  # the game system's inputs are never limited here
    assert [(o.input.player, o.code) for o in over] == [("a", "rate_limited"), ("c", "busy"), ("f", "busy")]
    assert "innkeeper" in over[1].why and "in all" in over[2].why


def test_error_replies_are_bounded_in_all_whatever_the_client_ids() -> None:
    replies = ErrorReplies(per_window=10, window=10.0, in_all=50)
    error = ErrorMessage(code="not_json", message="no", topic="t")
    sent = sum(replies.admit(f"p{n}", error, now=0.0) is not None for n in range(20_000))
    assert sent == 50 and replies.held == 19_950
    assert replies.admit("late", error, now=10.0) == error  # a new window


@pytest.mark.mosquitto
@pytest.mark.timeout(180)
async def test_a_flood_of_players_costs_a_bounded_number_of_inferences_and_replies(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """600 questions to the innkeeper at once: each tick takes its bounded share of them (they
    begin ticks early, at most ten times the pace) and refuses the rest as `busy`, and a question
    its NPC cannot answer within its inference bound is refused too: every one is answered or
    refused, once."""
    run_id, db, stats = "flood", tmp_path / "flood.db", RunStats()
    errors: list[ErrorMessage] = []
    replies: list[str] = []  # the ids the innkeeper's says answer
    stop = asyncio.Event()
    config = RunConfig(scenario=VILLAGE, run_id=run_id, until_tick=100_000, tick_ms=200,
                       broker=BrokerConfig(url=mosquitto.url), record=RecordConfig(db=str(db)))
    async with aiomqtt.Client("127.0.0.1", mosquitto.port, max_queued_outgoing_messages=None) as client:
        await client.subscribe(f"{topics.run_root(run_id)}/player/+/error", qos=1)
        await client.subscribe(topics.agent_say(run_id, "innkeeper"), qos=1)

        async def read() -> None:
            async for message in client.messages:
                payload = bytes(message.payload)  # type: ignore[arg-type]
                if message.topic.matches(topics.agent_say(run_id, "innkeeper")):
                    reply_to = decode_say(payload).reply_to
                    if reply_to is not None and reply_to.startswith("q"):
                        replies.append(reply_to)
                else:
                    errors.append(decode_error(payload))

        reader = asyncio.create_task(read())
        try:
            async with asyncio.TaskGroup() as group:
                job = group.create_task(run(config, stats=stats, stop=stop))
                await eventually(lambda: stats.tick >= 3, what="the run under way", within=60)
                for n in range(600):
                    payload = json.dumps({"to": "innkeeper", "text": f"Question {n}?", "id": f"q{n}"})
                    await client.publish(topics.player_input(run_id, f"p{n}"), payload, qos=1)
                await eventually(lambda: len(errors) + len(replies) >= 600, what="every question answered or refused",
                                 within=120)
                stop.set()
            await job
        finally:
            reader.cancel()
    with open_reader(db) as reader_:
        per_tick = collections.Counter(r.tick for r in reader_.audit_records("innkeeper"))
    assert max(per_tick.values()) <= InputBounds().npc_inferences_per_tick, per_tick
    assert {e.code for e in errors} == {"busy"}
    answered_or_refused = sorted([*replies, *(e.id for e in errors if e.id is not None)])
    assert answered_or_refused == sorted(f"q{n}" for n in range(600))  # each once: none lost, none taken silently


def facts_config(db: Path, mosquitto: MosquittoProcess, run_id: str, **bounds: int) -> RunConfig:
    return RunConfig(scenario=VILLAGE, run_id=run_id, until_tick=25, tick_ms=100,
                     broker=BrokerConfig(url=mosquitto.url), record=RecordConfig(db=str(db)),
                     limits=Limits(bounds=InputBounds(**bounds)))


@pytest.mark.mosquitto
@pytest.mark.timeout(180)
async def test_facts_past_an_npcs_bound_or_its_budget_are_refused_when_they_arrive(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    run_id, db, stats = "facts", tmp_path / "facts.db", RunStats()
    errors: list[ErrorMessage] = []
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
        await client.subscribe(topics.game_error(run_id), qos=1)

        async def read() -> None:
            async for message in client.messages:
                errors.append(decode_error(bytes(message.payload)))  # type: ignore[arg-type]

        reader = asyncio.create_task(read())
        try:
            async with asyncio.TaskGroup() as group:
                job = group.create_task(run(facts_config(db, mosquitto, run_id, facts_per_npc=5, game_text_chars=2000),
                                            stats=stats))
                await eventually(lambda: stats.tick >= 2, what="the run under way", within=60)
                for n in range(4):  # the innkeeper holds its scenario's facts, then these until its bound
                    fact = {"npc": "innkeeper", "id": f"f{n}", "text": f"Fact number {n}."}
                    await client.publish(topics.game_fact(run_id), json.dumps(fact), qos=1)
                huge = {"npc": "blacksmith", "id": "huge", "text": "The forge. " * 180}  # mandatory over 2,000
                await client.publish(topics.game_fact(run_id), json.dumps(huge), qos=1)
                await eventually(lambda: len(errors) >= 2, what="the refusals", within=60)
            await job
        finally:
            reader.cancel()
    assert {(e.code, e.id) for e in errors} >= {("over_budget", "huge")}
    assert all(e.code == "over_budget" for e in errors)
    with open_reader(db) as reader_:
        innkeeper = [r for r in reader_.audit_records("innkeeper") if r.tick > 10]
        blacksmith = list(reader_.audit_records("blacksmith"))
    assert innkeeper and all(len(r.state.canonical_facts) <= 5 for r in innkeeper)
    assert not any(r.report.over_budget for r in blacksmith)
    assert all("The forge. The forge." not in r.memory().prompt for r in blacksmith)


def at_and_over(name: str) -> list[tuple[str, dict[str, object], bool]]:
    """Messages of channel `name` at its schema's bounds (taken) and one past each (refused):
    (what, payload, over). The numbers are read from the contract's schema alone."""
    schema = message_schema(name)
    properties = next(iter(schema["definitions"].values()))["properties"]
    if name == "world-state":
        state = properties["state"]
        keys, key_chars, value_chars = (state["maxProperties"], state["propertyNames"]["maxLength"],
                                        state["additionalProperties"]["maxLength"])
        return [(f"{keys} keys", {"state": {f"k{n}": "v" for n in range(keys)}}, False),
                (f"{keys + 1} keys", {"state": {f"k{n}": "v" for n in range(keys + 1)}}, True),
                (f"a key of {key_chars}", {"state": {"k" * key_chars: "v"}}, False),
                (f"a key of {key_chars + 1}", {"state": {"k" * (key_chars + 1): "v"}}, True),
                (f"a value of {value_chars}", {"state": {"k": "v" * value_chars}}, False),
                (f"a value of {value_chars + 1}", {"state": {"k": "v" * (value_chars + 1)}}, True)]
    chars = properties["text"]["maxLength"]
    fields: dict[str, object] = {"player-input": {"to": "innkeeper"}, "game-event": {"location": "inn"},
                                 "game-fact": {"npc": "innkeeper"}}[name]
    found = []
    for n in (chars, chars + 1):
        named = {"id": f"{name}-{n}"} if "id" in properties else {}
        found.append((f"{name} of {n}", fields | named | {"text": "x" * n}, n > chars))
    return found


@pytest.mark.mosquitto
@pytest.mark.timeout(180)
async def test_a_message_at_the_contracts_bound_is_taken_and_one_character_more_is_refused_too_long(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """For every channel the run holds to a bound: what `npcsim contract --schema` says is the
    most is what a default run takes, and past it the run answers `too_long`."""
    run_id, db, stats = "bounds", tmp_path / "bounds.db", RunStats()
    assert message_schema("player-input")["definitions"]["PlayerInputMessage"]["properties"]["text"]["maxLength"] \
        == InputBounds().player_text_chars  # the schema's number is the run's
    errors: list[ErrorMessage] = []
    answered: list[str | None] = []
    config = RunConfig(scenario=VILLAGE, run_id=run_id, until_tick=60, tick_ms=100,
                       broker=BrokerConfig(url=mosquitto.url), record=RecordConfig(db=str(db)))
    sent = {name: at_and_over(name) for name in ("player-input", "game-event", "game-fact", "world-state")}
    (_, question, _), (_, fact, _) = sent["player-input"][0], sent["game-fact"][0]
    asked = question["id"]
    topic_of = {"player-input": topics.player_input(run_id, "tester"), "game-event": topics.game_event(run_id),
                "game-fact": topics.game_fact(run_id), "world-state": topics.world_state(run_id)}
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
        for topic in (topics.player_error(run_id, "tester"), topics.game_error(run_id),
                      topics.agent_say(run_id, "innkeeper")):
            await client.subscribe(topic, qos=1)

        async def read() -> None:
            async for message in client.messages:
                payload = bytes(message.payload)  # type: ignore[arg-type]
                if message.topic.value.endswith("/say"):
                    answered.append(decode_say(payload).reply_to)
                else:
                    errors.append(decode_error(payload))

        reader = asyncio.create_task(read())
        try:
            async with asyncio.TaskGroup() as group:
                job = group.create_task(run(config, stats=stats))
                await eventually(lambda: stats.tick >= 2, what="the run under way", within=60)
                for name, messages in sent.items():
                    for _, payload, _ in messages:
                        await client.publish(topic_of[name], json.dumps(payload), qos=1)
                overs = sum(over for messages in sent.values() for _, _, over in messages)
                await eventually(lambda: len(errors) >= overs and asked in answered,
                                 what="each message past its bound refused, the one at it answered", within=60)
                settled = stats.tick + 3
                await eventually(lambda: stats.tick >= settled, what="three ticks more", within=60)
            await job
        finally:
            reader.cancel()
    refused = [(e.code, e.topic, e.id) for e in errors]
    expected = [("too_long", topic_of[name], payload.get("id")) for name, messages in sent.items()
                for _, payload, over in messages if over]
    assert sorted(refused, key=str) == sorted(expected, key=str), [e.message for e in errors]
    with open_reader(db) as reader_:
        innkeeper = list(reader_.audit_records("innkeeper"))
    assert any(f.id == fact["id"] for f in innkeeper[-1].state.canonical_facts)
