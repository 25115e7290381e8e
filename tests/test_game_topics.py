"""The game system's topics and correlation ids on a real Mosquitto, with real stores.

A player's input with an `id` is answered by a `say` that carries it (`reply_to`) and the
player (`in_reply_to`); an event the game system publishes at the inn is in the
innkeeper's memory and prompt the tick after; a fact it adds is in every later prompt of
its NPC (the same id added again is refused with `exists` on `game/error`), and survives
`--resume`; replaced, its new text is in every later prompt and the old in none;
withdrawn, it is in none (a change of a fact the NPC does not hold is refused `no_fact`);
`npcsim replay` executes the run again to the same lines, the same `say` included.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import ClassVar

import aiomqtt
import msgspec
import pytest

from sim.memory import Fact, build_working_memory
from sim.mqtt import LocalBroker
from sim.scenario import load_scenario
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, VirtualClock, run
from sim.store import open_reader, read_arrivals
from sim.wire import topics
from sim.wire.events import ErrorMessage, SayMessage, decode_error, decode_say
from sim.wire.inputs import GameFact
from tests.helpers import VILLAGE, MosquittoProcess, Ran, eventually, npcsim_in_process
from tests.memory_broker import MemoryBroker
from tests.memory_shard import memory_shard
from tests.secured import SecuredBroker, password, secured_broker

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(300)]

RUN = "game"
EVENT = "A travelling bard starts to sing by the fire."
FACT = "A bard named Osric is staying at the inn."
REPLACED = "The bard Osric left the inn at dawn."


class Heard:
    """What a client subscribed to the say and error topics received, as it arrives."""

    def __init__(self) -> None:
        self.says: list[SayMessage] = []
        self.errors: list[ErrorMessage] = []

    def reply_to(self, input_id: str) -> list[SayMessage]:
        return [s for s in self.says if s.reply_to == input_id]


@asynccontextmanager
async def listening(mosquitto: MosquittoProcess) -> AsyncIterator[tuple[aiomqtt.Client, Heard]]:
    heard = Heard()
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
        await client.subscribe(f"{topics.run_root(RUN)}/agent/+/say", qos=1)
        await client.subscribe(topics.game_error(RUN), qos=1)

        async def read() -> None:
            async for message in client.messages:
                kind = topics.parse(message.topic.value)
                payload = bytes(message.payload)  # type: ignore[arg-type]
                if kind is not None and kind.kind == "agent_say":
                    heard.says.append(decode_say(payload))
                elif kind is not None:
                    heard.errors.append(decode_error(payload))

        reader = asyncio.create_task(read())
        try:
            yield client, heard
        finally:
            reader.cancel()


async def publish(client: aiomqtt.Client, topic: str, message: dict[str, object]) -> None:
    await client.publish(topic, json.dumps(message), qos=1)


async def ask(client: aiomqtt.Client, heard: Heard, stats: RunStats, input_id: str, text: str) -> SayMessage:
    """The visitor asks the innkeeper; the say that answers it."""
    await publish(client, topics.player_input(RUN, "visitor"), {"to": "innkeeper", "text": text, "id": input_id})
    answers = await eventually(lambda: heard.reply_to(input_id), what=f"the answer to {input_id}", within=60)
    return answers[0]


def config(db: Path, until: int, *, mosquitto: MosquittoProcess, resume: bool = False) -> RunConfig:
    return RunConfig(scenario=VILLAGE, run_id=RUN, until_tick=until, tick_ms=60, broker=BrokerConfig(url=mosquitto.url),
                     record=RecordConfig(db=str(db), resume=resume))


class SaysLocally(LocalBroker):
    """The replay's in-process broker, keeping every `say` published on it."""

    says: ClassVar[list[SayMessage]] = []  # the replay makes its broker itself

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        parsed = topics.parse(topic)
        if parsed is not None and parsed.kind == "agent_say":
            SaysLocally.says.append(decode_say(payload))
        super().publish(topic, payload, retain=retain)


async def test_correlation_events_and_facts_survive_resume_and_replay(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "game.db"
    stats = RunStats()
    async with listening(mosquitto) as (client, heard), asyncio.TaskGroup() as group:
        job = group.create_task(run(config(db, 30, mosquitto=mosquitto), stats=stats))
        await eventually(lambda: stats.tick >= 3, what="the run under way", within=60)
        await publish(client, topics.game_event(RUN), {"location": "inn", "text": EVENT, "significance": 0.8})
        await publish(client, topics.game_fact(RUN), {"npc": "innkeeper", "id": "bard", "text": FACT})
        await publish(client, topics.player_presence(RUN, "visitor"), {"location": "inn"})
        await eventually(lambda: stats.tick >= 8, what="the event and fact taken", within=60)
        await publish(client, topics.game_fact(RUN), {"npc": "innkeeper", "id": "bard", "text": "Another text"})
        said = await ask(client, heard, stats, "q1", "Who is singing?")
        exists = await eventually(lambda: [e for e in heard.errors if e.code == "exists"], what="exists", within=60)
        await job
    assert (said.agent, said.to, said.reply_to, said.in_reply_to) == ("innkeeper", "visitor", "q1", "visitor")
    assert exists == [ErrorMessage(code="exists", id="bard", topic=topics.game_fact(RUN),
                                   message=exists[0].message)] and '"replace"' in exists[0].message
    npcs = {"blacksmith", "innkeeper", "guard_captain", "snack_machine"}
    assert all((s.reply_to, s.in_reply_to) == (None, None) for s in heard.says if s.to in npcs)
    assert all((s.reply_to, s.in_reply_to) == (None, "player") for s in heard.says if s.to == "player")  # scripted
    with open_reader(db) as reader:
        answer = next(r for r in reader.audit_records("innkeeper") if r.id == said.inference_id)
    prompt = answer.memory().prompt
    assert FACT in prompt and EVENT in prompt, prompt
    assert "Another text" not in prompt

    resumed = RunStats()
    async with listening(mosquitto) as (client, heard), asyncio.TaskGroup() as group:
        job = group.create_task(run(config(db, 70, mosquitto=mosquitto, resume=True), stats=resumed))
        await eventually(lambda: resumed.tick >= 32, what="the resumed run under way", within=60)
        again = await ask(client, heard, resumed, "q2", "Still singing?")
        fact = topics.game_fact(RUN)
        await publish(client, fact, {"npc": "innkeeper", "id": "bard", "text": REPLACED, "action": "replace"})
        await publish(client, fact, {"npc": "innkeeper", "id": "harp", "action": "withdraw"})  # never held
        await publish(client, fact, {"npc": "innkeeper", "id": "bard", "action": "replace"})  # no text
        published = resumed.tick
        await eventually(lambda: resumed.tick >= published + 3, what="the replacement taken", within=60)
        replaced = await ask(client, heard, resumed, "q3", "Who sings now?")
        await publish(client, fact, {"npc": "innkeeper", "id": "bard", "action": "withdraw"})
        published = resumed.tick
        await eventually(lambda: resumed.tick >= published + 3, what="the withdrawal taken", within=60)
        gone = await ask(client, heard, resumed, "q4", "Anyone singing?")
        refused = await eventually(lambda: [e for e in heard.errors if e.code in ("no_fact", "schema")],
                                   what="the bad changes refused", within=60)
        await job
    assert (again.reply_to, again.in_reply_to) == ("q2", "visitor")
    assert sorted((e.code, e.id) for e in refused) == [("no_fact", "harp"), ("schema", "bard")], refused
    with open_reader(db) as reader:
        later = [r for r in reader.audit_records("innkeeper") if r.tick > said.tick]
    prompts = {r.id: (r.tick, r.memory().prompt) for r in later}
    assert prompts[replaced.inference_id][1].count(REPLACED) == 1 and FACT not in prompts[replaced.inference_id][1]
    assert REPLACED not in prompts[gone.inference_id][1] and FACT not in prompts[gone.inference_id][1]
    assert all(FACT in p for t, p in prompts.values() if t <= again.tick), "the fact went before it was replaced"
    first_replaced = min(t for t, p in prompts.values() if REPLACED in p)
    withdrawn = min(t for t, p in prompts.values() if t > first_replaced and REPLACED not in p)
    for tick, prompt in prompts.values():  # the old text until it was replaced, the new until withdrawn, then none
        expected = FACT if tick < first_replaced else REPLACED if tick < withdrawn else None
        assert all((text in prompt) == (text == expected) for text in (FACT, REPLACED)), (tick, expected)

    monkeypatch.setattr("sim.replay._rerun.LocalBroker", SaysLocally)
    ran: Ran = await asyncio.to_thread(npcsim_in_process, capsys, "replay", "--db", str(db))
    assert ran.code == 0, ran.err
    assert ran.out.startswith("identical: "), ran.out
    replayed = {s.inference_id: s for s in SaysLocally.says}
    assert replayed[said.inference_id] == said and replayed[again.inference_id] == again
    assert replayed[replaced.inference_id] == replaced and replayed[gone.inference_id] == gone
    assert msgspec.json.encode(replayed[said.inference_id]) == msgspec.json.encode(said)


async def test_an_event_is_in_the_memory_and_prompt_of_those_there_the_tick_after_and_a_present_player_overheard(
    tmp_path: Path,
) -> None:
    clock = VirtualClock(autojump=0.005)
    broker = MemoryBroker(1, clock, max_delay=0.0)
    scenario = load_scenario(VILLAGE)
    db = tmp_path / "event.db"
    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        config = RunConfig(scenario=VILLAGE, run_id="mem", until_tick=12)
        async with memory_shard(broker, scenario, config, db, RunStats(), asyncio.Event()) as shard:
            await shard.start()
            for tick in range(2):
                assert await shard.step(tick)
            broker.accept(topics.game_event("mem"), json.dumps({"location": "inn", "text": EVENT}).encode())
            broker.accept(topics.game_fact("mem"), json.dumps({"id": "bard", "text": FACT}).encode())
            broker.accept(topics.player_presence("mem", "visitor"), b'{"location": "square"}')
            await eventually(lambda: len(read_arrivals(db, 1)) == 3, what="all three in the journal")
            assert await shard.step(2)  # takes the event; its TickDone the fact and the presence
            before = {spec.id: shard.ctx.state(spec).canonical_facts for spec in shard.ctx.specs}
            said = {"to": "guard_captain", "text": "Open the gate!", "id": "g1"}
            broker.accept(topics.player_input("mem", "visitor"), json.dumps(said).encode())
            await eventually(lambda: len(read_arrivals(db, 2)) == 1, what="the input in the journal")
            assert await shard.step(3)  # every shard applies the fact and the presence, then the input
            states = {spec.id: shard.ctx.state(spec) for spec in shard.ctx.specs}
            overheard = [e.text for spec in shard.ctx.specs if spec.id == "snack_machine"
                         for e in shard.ctx.state(spec).episodic if "Open the gate!" in e.text]
        server.cancel()
    assert overheard == ["visitor said to guard_captain: \"Open the gate!\""]  # standing there, it is overheard
    innkeeper = states["innkeeper"]
    assert [(e.tick, e.significance) for e in innkeeper.episodic if e.text == EVENT] == [(2, 0.5)]
    assert all(EVENT not in (e.text for e in s.episodic) for npc, s in states.items() if npc != "innkeeper")
    assert all(Fact(id="bard", text=FACT) not in facts for facts in before.values())  # not before tick 3
    assert all(Fact(id="bard", text=FACT) in s.canonical_facts for s in states.values())  # a fact for every NPC
    prompt = build_working_memory(innkeeper, "visitor: Who sings?", scenario.memory).prompt  # tick 3's
    assert EVENT in prompt and FACT in prompt


BAD_INPUTS = [  # (payload, the error code its player gets, the id the error echoes)
    (b"Hello innkeeper", "not_json", None),
    (b'{"to": "nobody", "text": "Hi", "id": "b2"}', "unknown_npc", "b2"),
    (b'{"to": "innkeeper"}', "schema", None),
    (b'{"to": "innkeeper", "text": "Hi", "extra": 1, "id": "b4"}', "schema", "b4"),
    (b'{"king": "nobody"}', "schema", None),
    (b'{"to": "innkeeper", "text": ""}', "schema", None),
    (json.dumps({"to": "blacksmith", "text": "x" * 600, "id": "b7"}).encode(), "too_long", "b7"),
    (b"[1, 2]", "schema", None),
    (b'{"to": "innkeeper", "text": "Hi", "id": "not a name"}', "schema", None),
]
BAD_GAME = [  # (topic kind, payload, code)
    ("game_event", b'{"location": "moon", "text": "An eclipse"}', "unknown_location"),
    ("game_fact", b'{"npc": "nobody", "id": "f1", "text": "x"}', "unknown_npc"),
    ("game_fact", b"not json", "not_json"),
    ("game_event", b'{"location": "inn"}', "schema"),
]


async def test_each_refused_message_gets_one_error_reply_with_its_code_and_a_flood_is_bounded(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """Two shards: each refused message is answered once, by one of them."""
    run_id = "err"
    errors: list[tuple[str, ErrorMessage]] = []
    stats = [RunStats(), RunStats()]
    configs = [RunConfig(scenario=VILLAGE, run_id=run_id, until_tick=40, tick_ms=60, shard=f"{i}/2",
                         broker=BrokerConfig(url=mosquitto.url), record=RecordConfig(db=str(tmp_path / f"{i}.db")))
               for i in range(2)]
    root = topics.run_root(run_id)
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
        await client.subscribe(f"{root}/player/+/error", qos=1)
        await client.subscribe(topics.game_error(run_id), qos=1)
        await client.subscribe(f"{root}/marker", qos=1)
        marked = asyncio.Event()

        async def read() -> None:
            async for message in client.messages:
                if message.topic.value == f"{root}/marker":
                    marked.set()
                else:
                    errors.append((message.topic.value, decode_error(bytes(message.payload))))  # type: ignore[arg-type]

        reader = asyncio.create_task(read())
        await client.publish(topics.player_input(run_id, "ghost"), b'{"to": "innkeeper", "text": "boo"}', qos=1,
                             retain=True)
        async with asyncio.TaskGroup() as group:
            jobs = [group.create_task(run(c, stats=s)) for c, s in zip(configs, stats, strict=True)]
            await eventually(lambda: min(s.tick for s in stats) >= 3, what="the run under way", within=60)
            for n, (payload, _, _) in enumerate(BAD_INPUTS):
                await client.publish(topics.player_input(run_id, f"p{n}"), payload, qos=1)
            for kind, payload, _ in BAD_GAME:
                await client.publish(topics.game_event(run_id) if kind == "game_event" else topics.game_fact(run_id),
                                     payload, qos=1)
            await client.publish(topics.player_presence(run_id, "p0"), b'{"location": "moon"}', qos=1)
            for _ in range(100):
                await client.publish(topics.player_input(run_id, "flooder"), b"{", qos=1)
            await asyncio.gather(*jobs)
        await client.publish(topics.player_input(run_id, "ghost"), b"", qos=1, retain=True)  # cleared
        await client.publish(f"{root}/marker", b"", qos=1)
        await asyncio.wait_for(marked.wait(), 30)  # every reply the shards published came before it
        reader.cancel()
    by_topic: dict[str, list[ErrorMessage]] = {}
    for topic, error in errors:
        by_topic.setdefault(topic, []).append(error)
    for n, (payload, code, input_id) in enumerate(BAD_INPUTS):
        [error] = by_topic.pop(topics.player_error(run_id, f"p{n}"))  # exactly one reply
        assert (error.code, error.id, error.topic) == (code, input_id, topics.player_input(run_id, f"p{n}")), payload
    [retained] = by_topic.pop(topics.player_error(run_id, "ghost"))
    assert retained.code == "retained"
    flood = by_topic.pop(topics.player_error(run_id, "flooder"))
    assert [e.code for e in flood] == ["not_json"] * 10 + ["rate_limited"]
    assert sum(s.bus.errors_held for s in stats) >= 90
    game = by_topic.pop(topics.game_error(run_id))
    assert sorted(e.code for e in game) == sorted([*(code for _, _, code in BAD_GAME), "unknown_location"])
    assert by_topic == {}


def logged_in(broker: SecuredBroker, user: str) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", broker.port, username=user, password=password(user),
                          protocol=aiomqtt.ProtocolVersion.V5)


async def test_with_logins_a_player_reads_only_its_own_errors_and_cannot_publish_the_game_topics(
    tmp_path: Path,
) -> None:
    db = tmp_path / "acl.db"
    run_id = "acl"
    got: dict[str, list[tuple[str, ErrorMessage]]] = {"alice": [], "bob": []}
    with secured_broker() as broker:
        stats = RunStats()
        config = RunConfig(scenario=VILLAGE, run_id=run_id, until_tick=30, tick_ms=60,
                           broker=BrokerConfig(url=broker.url_for("shard")), record=RecordConfig(db=str(db)))
        async with logged_in(broker, "alice") as alice, logged_in(broker, "bob") as bob, \
                logged_in(broker, "game") as game:

            async def read(name: str, player: aiomqtt.Client) -> None:
                async for message in player.messages:
                    got[name].append((message.topic.value, decode_error(bytes(message.payload))))  # type: ignore[arg-type]

            readers = []
            for name, player in (("alice", alice), ("bob", bob)):
                await player.subscribe(f"{topics.run_root(run_id)}/player/+/error", qos=1)
                readers.append(asyncio.create_task(read(name, player)))
            async with asyncio.TaskGroup() as group:
                job = group.create_task(run(config, stats=stats))
                await eventually(lambda: stats.tick >= 3, what="the run under way", within=60)
                await alice.publish(topics.game_event(run_id), json.dumps({"location": "inn", "text": "FORGED"}),
                                    qos=1)
                await alice.publish(topics.game_fact(run_id), json.dumps({"id": "forged", "text": "FORGED"}), qos=1)
                await alice.publish(topics.player_presence(run_id, "alice"), b'{"location": "inn"}', qos=1)
                await game.publish(topics.game_fact(run_id), json.dumps({"id": "real", "text": "The well is dry."}),
                                   qos=1)
                await bob.publish(topics.player_input(run_id, "bob"), b'{"to": "nobody", "text": "Hi", "id": "b1"}',
                                  qos=1)
                await eventually(lambda: got["bob"], what="bob's error", within=60)
                await alice.publish(topics.player_input(run_id, "alice"), b"{", qos=1)
                await eventually(lambda: got["alice"], what="alice's error", within=60)  # bob's would have come first
                await job
            for reader in readers:
                reader.cancel()
    assert [(t, e.code, e.id) for t, e in got["bob"]] == [(topics.player_error(run_id, "bob"), "unknown_npc", "b1")]
    assert [(t, e.code) for t, e in got["alice"]] == [(topics.player_error(run_id, "alice"), "not_json")]
    with open_reader(db) as reader:
        taken = [i for _, i in reader.all_inputs()]
    assert taken == [GameFact(seq=taken[0].seq, npc=None, id="real", text="The well is dry.")]  # none of alice's
