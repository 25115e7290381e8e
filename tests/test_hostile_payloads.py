"""A crafted payload refused, never fatal: nesting past the interpreter's stack on every topic a run reads.

msgspec raises RecursionError, not DecodeError, on such nesting, even inside a field the target
type skips; a 2 KB message on `player/+/input` used to end `npcsim run` with a traceback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt
import pytest

from sim.cli.subscribe import decoded
from sim.protocol.bounds import InputBounds
from sim.protocol.received import InputRefused
from sim.protocol.router import Router
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader
from sim.view.model import RunModel
from sim.wire import topics
from sim.wire.batch import decode_batch
from sim.wire.events import decode_error
from sim.wire.inference import decode_request, decode_result
from sim.wire.trace import decode_traces
from tests.helpers import VILLAGE, MosquittoProcess, eventually

DEPTH = 100_000
NESTED = b"[" * DEPTH + b"]" * DEPTH
IN_A_FIELD = b'{"to": "innkeeper", "id": "q1", "text": ' + b"[" * 1000 + b"]" * 1000 + b"}"
IN_AN_UNKNOWN_FIELD = b'{"id": "f1", "npc": "innkeeper", "x": ' + b"[" * 1000 + b"]" * 1000 + b', "text": "t"}'
MSGPACK_NESTED = b"\x91" * DEPTH + b"\xc0"  # fixarray of one, nested
HOSTILE = (NESTED, IN_A_FIELD, IN_AN_UNKNOWN_FIELD, MSGPACK_NESTED)


def router() -> Router:
    r = Router("r", "0", mailbox_size=10, seen_events=100, bounds=InputBounds())
    r.route("player-input")
    r.route("world-state")
    for channel in ("game-event", "game-fact", "game-move", "game-goal", "presence"):
        r.route(channel)
    r.route_barrier()
    r.route_location(topics.location_events("r", "inn"), "inn", 1)
    r.route_inboxes({"innkeeper"})
    return r


PUBLIC = [topics.player_input("r", "anyone"), topics.game_fact("r"), topics.game_event("r"), topics.game_move("r"),
          topics.game_goal("r"), topics.player_presence("r", "anyone"), topics.world_state("r")]
INTERNAL = [topics.location_events("r", "inn"), topics.agent_inbox("r", "innkeeper"), topics.barrier("r", "1")]


@pytest.mark.parametrize("payload", HOSTILE, ids=["nested", "in-a-field", "in-an-unknown-field", "msgpack"])
def test_nesting_on_every_routed_topic_is_refused_and_counted(payload: bytes) -> None:
    r = router()
    for topic in PUBLIC:
        refusal = r.receive(topic, payload)
        assert isinstance(refusal, InputRefused), topic
        assert refusal.error.code in ("not_json", "schema"), (topic, refusal.error)
    for topic in INTERNAL:
        assert r.receive(topic, payload) is None, topic
    assert sum(r.stats.malformed.values()) == len(PUBLIC) + len(INTERNAL)


@pytest.mark.parametrize("payload", HOSTILE, ids=["nested", "in-a-field", "in-an-unknown-field", "msgpack"])
def test_every_other_reader_of_outside_bytes_refuses_nesting(payload: bytes) -> None:
    assert decode_batch(payload, decode_request)[0] == []
    assert decode_batch(payload, decode_result)[0] == []
    signed, value = decoded(payload)  # npcsim subscribe --all
    assert not signed and (value == {"undecoded_bytes": len(payload), "head_hex": payload[:32].hex()}
                           or isinstance(value, dict))
    model = RunModel("r")
    for topic in (topics.world_state("r"), topics.status("r", "0"), topics.trace("r", "0"), topics.roster("r", "0"),
                  topics.agent_say("r", "innkeeper")):
        model.feed(topic, payload, now=0.0)
    assert model.health.malformed == 5
    with pytest.raises(Exception) as raised:
        decode_traces(payload)
    assert not isinstance(raised.value, RecursionError)


@pytest.mark.mosquitto
@pytest.mark.timeout(120)
async def test_a_nested_message_on_player_input_or_game_fact_does_not_end_a_run(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    run_id = "nest"
    db = tmp_path / "nest.db"
    stats = RunStats()
    errors: list[bytes] = []
    config = RunConfig(scenario=VILLAGE, run_id=run_id, until_tick=20, tick_ms=50,
                       broker=BrokerConfig(url=mosquitto.url), record=RecordConfig(db=str(db)))
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
        await client.subscribe(topics.player_error(run_id, "anyone"), qos=1)
        await client.subscribe(topics.game_error(run_id), qos=1)

        async def read() -> None:
            async for message in client.messages:
                errors.append(bytes(message.payload))  # type: ignore[arg-type]

        reader = asyncio.create_task(read())
        try:
            async with asyncio.TaskGroup() as group:
                job = group.create_task(run(config, stats=stats))
                await eventually(lambda: stats.tick >= 2, what="the run under way", within=60)
                for payload in HOSTILE:
                    await client.publish(topics.player_input(run_id, "anyone"), payload, qos=1)
                    await client.publish(topics.game_fact(run_id), payload, qos=1)
                await eventually(lambda: len(errors) >= 2 * len(HOSTILE), what="every refusal answered", within=60)
            ended = job.result()
        finally:
            reader.cancel()
    assert ended.tick == 19  # ran to its end (until_tick is the first tick not run)
    assert ended.bus is not None
    assert ended.bus.malformed == {"player input": len(HOSTILE), "game fact": len(HOSTILE)}
    assert sorted({decode_error(e).code for e in errors}) <= ["not_json", "schema"]
    with open_reader(db) as reader_:
        assert all("[[" not in a.prompt for r in reader_.audit_records() for a in r.attempts)
