"""A subscriber with a persistent session receives every line said across broker outages.

A listener connects before the run with an MQTT 5 persistent session (clean_start False, a
session expiry) and subscribes to every NPC's `say` topic at QoS 1; Mosquitto runs with
persistence on, so that session outlives a restart. While a two-shard village run speaks,
the broker is stopped (SIGTERM, or kill -9: then what it held since its last autosave a
second before is gone) for longer than the echo timeout and started again on the same
port. The listener reconnects with its session and counts what it gets: every line said
(one audit record per inference, in the stores) is received, each once after
de-duplication by inference id.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sim.shard import BrokerConfig, Limits, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader
from sim.wire import topics
from sim.wire.events import decode_say
from tests.helpers import VILLAGE, MosquittoProcess, committed_tick, elapse, eventually, require_mosquitto, start_npcsim

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(300)]

RUN = "outage"
TICKS = 70


def persistent_mosquitto(tmp_path: Path) -> MosquittoProcess:
    """The dev broker with persistence on: sessions and queued messages saved every second and at a stop."""
    broker = MosquittoProcess(require_mosquitto(), tmp_path)
    body = broker.config_path.read_text().replace("persistence false", "persistence true")
    # `user root`: started as root, Mosquitto would drop to its own user, which cannot write
    # into a test's private directory (started as anyone else, it stays that user)
    broker.config_path.write_text(f"{body}persistence_location {tmp_path}/\nautosave_interval 1\nuser root\n")
    return broker


async def saved_since(tmp_path: Path, since: float) -> None:
    """Until the broker has saved its state (its autosave, at most every two seconds) after
    `since`: then a kill -9 keeps what it held at `since`, sessions and subscriptions."""
    saved = tmp_path / "mosquitto.db"
    await eventually(lambda: saved.exists() and saved.stat().st_mtime > since + 0.01,
                     what="the broker saving its state", within=10)


def kill_9(broker: MosquittoProcess) -> None:
    """SIGKILL: the broker saves nothing more (what it holds since its last autosave is gone)."""
    assert broker.proc is not None
    broker.proc.kill()
    broker.proc.wait(timeout=5)
    if broker.proc.stderr is not None:
        broker.proc.stderr.close()


class Listener:
    """A `say` subscriber with a persistent session, reconnecting with it whenever it is lost."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.received: list[str] = []  # inference ids, in arrival order, duplicates included
        self.connections = 0
        self.subscribed = asyncio.Event()

    async def listen(self) -> None:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 600
        while True:
            try:
                async with aiomqtt.Client("127.0.0.1", self.port, identifier="say-listener", clean_start=False,
                                          protocol=aiomqtt.ProtocolVersion.V5, properties=properties) as client:
                    self.connections += 1
                    if self.connections == 1:
                        await client.subscribe(f"{topics.run_root(RUN)}/agent/+/say", qos=1)
                        self.subscribed.set()
                    async for message in client.messages:
                        self.received.append(decode_say(bytes(message.payload)).inference_id)  # type: ignore[arg-type]
            except aiomqtt.MqttError:
                await elapse(0.1)  # the subject: the broker is away, try again a little later, with the same session


@pytest.mark.parametrize("how", ["stop", "kill -9"])
async def test_every_line_said_reaches_a_persistent_subscriber_across_an_outage(how: str, tmp_path: Path) -> None:
    broker = persistent_mosquitto(tmp_path)
    broker.start()
    try:
        listener = Listener(broker.port)
        configs = [RunConfig(
            scenario=VILLAGE, run_id=RUN, ticks=TICKS, tick_ms=60, shard=f"{i}/2", broker=BrokerConfig(url=broker.url),
            limits=Limits(echo_timeout=1.0), record=RecordConfig(db=str(tmp_path / f"say-{i}.db")),
        ) for i in range(2)]
        stats = [RunStats() for _ in configs]
        async with asyncio.TaskGroup() as group:
            listening = group.create_task(listener.listen())
            await listener.subscribed.wait()
            await saved_since(tmp_path, time.time())  # the subject: the broker's saved state holds the session
            jobs = [group.create_task(run(c, stats=s)) for c, s in zip(configs, stats, strict=True)]
            await eventually(lambda: min(s.tick for s in stats) >= 6, what="the run getting going", within=120)
            await asyncio.to_thread(broker.stop if how == "stop" else lambda: kill_9(broker))
            await elapse(2.5)  # the subject: longer than the echo timeout (1 s), lines said meanwhile
            await asyncio.to_thread(broker.start)
            await asyncio.gather(*jobs)
            said = set()
            for c in configs:
                with open_reader(Path(str(c.record.db))) as reader:
                    said |= {r.id for r in reader.audit_records()}
            with contextlib.suppress(AssertionError):  # the comparison below says what is missing
                await eventually(lambda: said <= set(listener.received), what="every line said", within=20)
            listening.cancel()
    finally:
        broker.stop()
    assert all(s.bus is not None and s.bus.reconnects >= 1 for s in stats), "the outage did not hit the run"
    assert listener.connections >= 2, "the listener never lost its connection"
    received = set(listener.received)
    missing = sorted(said - received, key=lambda i: int(i.split(":")[2]))
    assert received == said, f"{len(missing)} lines said never received {missing[:5]}, {len(received - said)} unknown"
    print(f"\n{len(said)} lines said, {len(listener.received)} received, {len(received)} after de-duplication")


def audit_ids(db: Path) -> set[str]:
    with open_reader(db) as reader:
        return {r.id for r in reader.audit_records()}


def audit_count(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return int(conn.execute("SELECT count(*) FROM audit").fetchone()[0])
    except sqlite3.Error:
        return 0


async def test_lines_of_committed_ticks_still_in_the_outbox_are_sent_after_a_kill_9(tmp_path: Path) -> None:
    """One shard goes on ticking while the broker is away; the lines it says wait in its
    outbox. Killed -9 then, those of committed ticks are not said again on --resume (their
    ticks do not run again): the shard kept them with each commit and sends them again."""
    broker = persistent_mosquitto(tmp_path)
    broker.start()
    db, log = tmp_path / "outbox.db", tmp_path / "outbox.log"
    listener = Listener(broker.port)

    async def shard(*extra: str) -> asyncio.subprocess.Process:
        with log.open("ab") as err:
            return await start_npcsim("run", VILLAGE, "--broker", broker.url, "--run-id", RUN, "--tick-ms", "100",
                                      "--until-tick", str(TICKS), "--db", str(db), "--quiet", *extra,
                                      stdout=asyncio.subprocess.DEVNULL, stderr=err)

    proc: asyncio.subprocess.Process | None = None
    try:
        async with asyncio.TaskGroup() as group:
            listening = group.create_task(listener.listen())
            await listener.subscribed.wait()
            await saved_since(tmp_path, time.time())  # the subject: the broker's saved state holds the session
            proc = await shard()
            await eventually(lambda: committed_tick(db) >= 5, what="the run getting going", within=120)
            await asyncio.to_thread(broker.stop)
            before = audit_count(db)
            await eventually(lambda: audit_count(db) >= before + 3, what="lines said while the broker is away",
                             within=60)
            proc.kill()
            await proc.wait()
            killed_after = committed_tick(db)
            await asyncio.to_thread(broker.start)
            proc = await shard("--resume")
            async with asyncio.timeout(180):
                code = await proc.wait()
            assert code == 0, log.read_text()[-2000:]
            said = audit_ids(db)
            with contextlib.suppress(AssertionError):  # the comparison below says what is missing
                await eventually(lambda: said <= set(listener.received), what="every line said", within=20)
            listening.cancel()
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        broker.stop()
    received = set(listener.received)
    missing = sorted(said - received, key=lambda i: int(i.split(":")[2]))
    assert received == said, f"{len(missing)} lines said never received {missing[:5]}, {len(received - said)} unknown"
    print(f"\nkilled after tick {killed_after}: {len(said)} lines said, {len(listener.received)} received, "
          f"{len(received)} after de-duplication")
