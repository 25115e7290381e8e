"""Signed messages are bound to their run instance; peers' requests are served within bounds.

The seal covers the run nonce (sim.protocol.seal): a message captured in one run and
replayed into another run of the same id and key file is refused and counted. Shards of
one run share the nonce (chosen by shard 0, learnt by the others with a challenge). A Join
replayed 3,000 times is served once; on a broker with neither login nor key, a forged Join
with another shard count does not stop a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest

from sim.errors import ConfigError
from sim.protocol.admission import Admission
from sim.protocol.bounds import InputBounds
from sim.protocol.router import Router
from sim.protocol.seal import OTHER_RUN, UNSIGNED, RunKey, load_run_key, new_nonce, refusal
from sim.scenario import load_scenario
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, Shard, VirtualClock, run
from sim.shard._instance import kept_messages
from sim.store import open_reader, open_store
from sim.wire import topics
from sim.wire.barrier import Hello, Join, TickDone, decode_barrier, encode_barrier
from sim.wire.events import EventBatch, Speech, decode_say, encode_batch, event_id
from tests.helpers import REPO, MosquittoProcess, eventually
from tests.memory_broker import MemoryBroker
from tests.memory_shard import memory_shard

VILLAGE = str(REPO / "scenarios" / "village.toml")
KEY = RunKey(b"0123456789abcdef0123456789abcdef")
GHOST = "REPLAYED-GHOST-WORDS from run 1"


def inbox_batch(text: str) -> bytes:
    speech = Speech(id="r:ghost:3:1", tick=3, speaker="ghost", to="guard", text=text, from_player=True)
    return encode_batch(EventBatch(shard="0", tick=3, events=(speech,)))


def router(key: RunKey) -> Router:
    r = Router("r", "0", mailbox_size=10, seen_events=100, bounds=InputBounds(), run_key=key)
    r.route_inboxes(["guard"])
    r.route_barrier()
    return r


def test_a_message_sealed_for_another_run_is_refused_and_said_so() -> None:
    run1, run2 = KEY.for_run(new_nonce()), KEY.for_run(new_nonce())
    topic = "npcsim/r/agent/guard/inbox"
    captured = run1.sign(topic, inbox_batch(GHOST))
    assert run1.open(topic, captured) is not None and run2.open(topic, captured) is None
    assert refusal(run2, topic, captured) == OTHER_RUN
    assert refusal(run2, topic, RunKey(b"z" * 32).for_run(new_nonce()).sign(topic, inbox_batch("x"))) == UNSIGNED
    assert KEY.open(topic, captured) is not None  # a worker's key, bound to no run, serves every instance
    r = router(run2)
    assert r.receive(topic, captured) is None
    assert r.mail.mailbox("guard").drain() == []
    assert r.stats.refused == {OTHER_RUN: 1}
    r.receive(topic, run2.sign(topic, inbox_batch("this run")))
    assert [e.text for e in r.mail.mailbox("guard").drain()] == ["this run"]
    assert "0123" not in repr(run2)


def test_only_a_hello_travels_without_the_run_nonce() -> None:
    bound = KEY.for_run(new_nonce())
    r = router(bound)
    topic = topics.barrier("r", "1")
    hello = Hello(shard="1", shards=2, challenge="ab" * 16)
    got = r.receive(topic, KEY.sign(topic, encode_barrier(hello)))  # KEY has no nonce: it seals unbound
    assert got is not None and got.message == hello
    done = TickDone(shard="1", shards=2, tick=0, batches={})
    assert r.receive(topic, KEY.sign(topic, encode_barrier(done))) is None  # a TickDone needs the nonce
    assert r.stats.refused == {UNSIGNED: 1}


def test_each_request_of_a_peer_is_served_once_and_a_few_per_tick() -> None:
    admission = Admission(per_tick=4)
    assert sum(admission.admit("1", ("join", "s", 0), tick=5) for _ in range(3000)) == 1
    assert [admission.admit("1", ("join", "s", n), tick=5) for n in range(1, 6)] == [True] * 3 + [False] * 2
    assert admission.admit("1", ("join", "s", 9), tick=6)  # a new tick, a new allowance
    assert admission.admit("2", ("join", "s", 0), tick=6)  # per peer
    assert admission.refused == 3000 - 1 + 2


@contextlib.asynccontextmanager
async def keyed_shard(broker: MemoryBroker, tmp_path: Path, key: RunKey, stop: asyncio.Event) -> AsyncIterator[Shard]:
    """Shard 0 of 2 of the village on the in-memory broker, with a bound run key."""
    scenario = load_scenario(VILLAGE)
    config = RunConfig(scenario=VILLAGE, run_id="mem", ticks=5, shard="0/2")
    async with memory_shard(broker, scenario, config, tmp_path / "flood.db", RunStats(shard="0"), stop, run_key=key,
                            seed=7) as shard:
        yield shard


async def test_a_join_replayed_3000_times_is_served_once(tmp_path: Path) -> None:
    clock = VirtualClock(autojump=0.005)
    broker = MemoryBroker(1, clock, max_delay=0.0)
    key = KEY.for_run(new_nonce())
    stop = asyncio.Event()
    own = topics.barrier("mem", "0")
    peer = topics.barrier("mem", "1")
    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        async with keyed_shard(broker, tmp_path, key, stop) as shard:
            await shard.start()
            stepping = group.create_task(shard.step(0))  # holds: shard 1 never finishes tick 0
            def own_messages(since: int = 0) -> list[bytes]:
                return [p for topic, p in broker.published[since:] if topic == own]

            await eventually(lambda: len(own_messages()) >= 2, what="shard 0 never sent its Join and TickDone")
            join = key.sign(peer, encode_barrier(Join(shard="1", shards=2, tick=0, session="peer", seq=0)))
            sent_before = len(broker.published)
            for _ in range(3000):
                broker.accept(peer, join)
            refused = shard.bus.stats.refused
            await eventually(lambda: refused.get("repeated barrier request", 0) == 2999, what="the Joins never arrived")
            await eventually(lambda: bool(own_messages(sent_before)), what="the first Join was not served")
            await shard.bus.wait_sent()
            resent = [decode_barrier(key.open(own, p) or b"") for p in own_messages(sent_before)]
            stop.set()
            assert await stepping is False
        server.cancel()
    assert len(resent) == 1 and isinstance(resent[0], TickDone)  # what it keeps, sent again once


async def test_a_forged_join_with_another_shard_count_does_not_stop_a_run_on_an_open_broker(
    mosquitto: MosquittoProcess,
) -> None:
    stop, ready = asyncio.Event(), asyncio.Event()
    config = RunConfig(scenario=VILLAGE, run_id="open", ticks=40, tick_ms=25, broker=BrokerConfig(url=mosquitto.url))
    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stop=stop, on_ready=lambda _: ready.set()))
        await ready.wait()
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as forger:
            forged = encode_barrier(Join(shard="1", shards=4, tick=0))
            await forger.publish(topics.barrier("open", "1"), forged, qos=1)
            await forger.publish(topics.barrier("open", "0"), encode_barrier(Join(shard="0", shards=4, tick=0)), qos=1)
        stats = await job
    assert stats.tick == 39  # ran to its end
    assert stats.bus.refused.get("unauthenticated shard count conflict") == 1  # the one on another shard's topic
    assert stats.bus.malformed.get("barrier") is None


async def ghost_run(mosquitto: MosquittoProcess, db: Path, key_file: Path, *, replay: bytes | None) -> RunStats:
    """A village run `ghost` with the key file, in which a visitor speaks to the innkeeper.

    Run 1 (`replay` None): the player `ghost` speaks too, and its words reach the
    innkeeper's inbox. Run 2: `replay` is published into the inbox, before and after the
    visitor is answered.
    """
    stop, ready = asyncio.Event(), asyncio.Event()
    stats = RunStats()
    config = RunConfig(
        scenario=VILLAGE, run_id="ghost", ticks=400, tick_ms=25,
        broker=BrokerConfig(url=mosquitto.url, run_key_file=str(key_file)), record=RecordConfig(db=str(db)),
    )
    inbox = topics.agent_inbox("ghost", "innkeeper")
    waiting_for = {"visitor"} if replay is not None else {"visitor", "ghost"}
    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stats=stats, stop=stop, on_ready=lambda _: ready.set()))
        await ready.wait()
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(topics.agent_say("ghost", "innkeeper"), qos=1)
            if replay is None:
                await client.publish(topics.player_input("ghost", "ghost"),
                                     f'{{"to": "innkeeper", "text": "{GHOST}"}}'.encode(), qos=1)
            else:
                await client.publish(inbox, replay, qos=1)
            await client.publish(topics.player_input("ghost", "visitor"), b'{"to": "innkeeper", "text": "Ale!"}',
                                 qos=1)
            async with asyncio.timeout(30):
                async for message in client.messages:
                    payload = bytes(message.payload)  # type: ignore[arg-type]
                    waiting_for.discard(decode_say(payload).to or "")
                    if not waiting_for:
                        break
            if replay is not None:
                await client.publish(inbox, replay, qos=1)  # and once more, later in the run
                await eventually(lambda: stats.bus is not None and stats.bus.refused.get(OTHER_RUN, 0) >= 2,
                                 what="the replayed message was not refused twice")
        stop.set()
        await job
    return stats


async def as_run_1_sealed_it(db: Path, key_file: Path) -> bytes:
    """The ghost's words as a shard of run 1 publishes them when the innkeeper is another
    shard's: the inbox batch of the event they became, sealed with the key for run 1's nonce.

    (A shard delivers its own NPCs' mail itself, so a one-shard run puts nothing of it on
    the broker to capture: these are the bytes it would have put there.)
    """
    async with open_store(db) as store:
        await store.seal_with(load_run_key(str(key_file)))  # the store is sealed with the run's key
        assert store.identity is not None and store.last_tick is not None
        nonce = bytes.fromhex(store.identity.nonce)
        said = [(tick, i.seq) for tick in range(store.last_tick + 1)
                for i in await store.resume.inputs(tick) if i.player == "ghost" and i.text == GHOST]
    [(tick, seq)] = said
    speech = Speech(id=event_id("ghost", "ghost", tick, 1_000_000 + seq), tick=tick, speaker="ghost", to="innkeeper",
                    text=GHOST, from_player=True)
    inbox = topics.agent_inbox("ghost", "innkeeper")
    key = load_run_key(str(key_file)).for_run(nonce)
    return key.sign(inbox, encode_batch(EventBatch(shard="0", tick=tick, events=(speech,))))


def prompts_with(db: Path, words: str) -> int:
    with open_reader(db) as reader:
        return sum(any(words in a.prompt for a in r.attempts) for r in reader.audit_records())


async def test_a_signed_message_of_an_earlier_run_of_the_same_id_is_dropped_and_counted(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    key_file = tmp_path / "run.key"
    key_file.write_text("a key both runs of the village share\n")
    await ghost_run(mosquitto, tmp_path / "run1.db", key_file, replay=None)
    assert prompts_with(tmp_path / "run1.db", GHOST) > 0  # where it reached a prompt
    captured = await as_run_1_sealed_it(tmp_path / "run1.db", key_file)
    assert captured.startswith(b"NPK2")
    second = await ghost_run(mosquitto, tmp_path / "run2.db", key_file, replay=captured)
    assert second.bus is not None and second.bus.refused.get(OTHER_RUN, 0) >= 2
    assert prompts_with(tmp_path / "run2.db", GHOST) == 0
    async with open_store(tmp_path / "run2.db") as store:
        await store.seal_with(load_run_key(str(key_file)))  # the store is sealed with the run's key
        heard = [i.text for tick in range(second.tick + 1) for i in await store.resume.inputs(tick)]
    assert heard == ["Ale!"]


async def test_shards_of_a_keyed_run_share_its_nonce_after_a_late_start_and_a_resume(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    key_file = tmp_path / "run.key"
    key_file.write_text("the key of a two-shard village run\n")
    dbs = [tmp_path / f"s{i}.db" for i in range(2)]
    key = RunKey(key_file.read_bytes().strip())

    def config(i: int, until: int, *, resume: bool = False) -> RunConfig:
        return RunConfig(scenario=VILLAGE, broker=BrokerConfig(url=mosquitto.url, run_key_file=str(key_file)),
                         run_id="pair", shard=f"{i}/2", until_tick=until,
                         record=RecordConfig(db=str(dbs[i]), resume=resume))

    hellos: list[Hello] = []
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as watcher:
        await watcher.subscribe(topics.barrier("pair", "1"), qos=1)
        async with asyncio.TaskGroup() as group:
            late = group.create_task(run(config(1, 6)))  # shard 1 first: it asks shard 0 until it is there
            async with asyncio.timeout(30):
                async for message in watcher.messages:
                    opened = key.open_any(message.topic.value, bytes(message.payload))  # type: ignore[arg-type]
                    said = None if opened is None else decode_barrier(opened[1])
                    if isinstance(said, Hello):
                        hellos.append(said)
                        if len(hellos) >= 2:
                            break
            first = await run(config(0, 6))
            second = await late
    assert first.tick == second.tick == 5
    assert len({h.challenge for h in hellos}) == len(hellos)  # a fresh challenge each time
    resumed = await asyncio.gather(run(config(0, 10, resume=True)), run(config(1, 10, resume=True)))
    assert [s.tick for s in resumed] == [9, 9]
    assert all(not s.bus.refused for s in (first, second, *resumed)), [s.bus.refused for s in resumed]
    nonces = set()
    for db in dbs:
        with open_reader(db) as reader:
            identity = reader.run_identity()
        assert identity is not None
        nonces.add(identity.nonce)
    assert len(nonces) == 1


def test_kept_messages_this_start_cannot_send_again_stop_a_resume_naming_the_key() -> None:
    config = RunConfig(
        scenario=VILLAGE, broker=BrokerConfig(run_key_file="second.key"), record=RecordConfig(db="tw.db", resume=True),
    )
    mine = KEY.for_run(new_nonce())
    sealed = [(4, "t", mine.sign("t", b"\x91\x00"))]
    assert kept_messages(sealed, mine, config) == sealed
    other = RunKey(b"z" * 32).for_run(new_nonce())
    refusals = [
        (other, sealed, "is sealed with another run key than --run-key-file second.key"),
        (None, sealed, "is sealed with a run key, and this start has none"),
        (mine, [(4, "t", b"\x91\x00")], "is not sealed (the run's first start had no run key)"),
    ]
    for key, sent, expected in refusals:
        with pytest.raises(ConfigError, match=re.escape(f"--resume: what tw.db kept of tick 4 {expected}")):
            kept_messages(sent, key, config)
