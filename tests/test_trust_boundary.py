"""The trust boundary on a real Mosquitto with the shipped auth.conf and acl (docs/operations.md, "Security").

Every npcsim process logs in (run, worker, subscribe, loadtest); a player may publish only
its own input; each attack found on the anonymous broker is refused by the broker or
refused and counted by npcsim, and the audit afterwards holds none of the forged text; no
password appears in any output.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import aiomqtt
import pytest

from sim.cli import main
from sim.cli.run import summary_rows
from sim.inference import InferenceResult, RemoteWorker, WorkerConfig, encode_result
from sim.mqtt import BrokerAddress
from sim.protocol.seal import load_run_key
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader
from sim.wire import topics
from sim.wire.events import EventBatch, Notice, Speech, encode_batch
from tests.helpers import VILLAGE, MosquittoProcess, elapse, ended, read_until, require_mosquitto, start_npcsim
from tests.secured import ROLES, SecuredBroker, password, secured_broker

pytestmark = pytest.mark.mosquitto
FORGED = "FORGED-KING-ALIVE"


def client(broker: SecuredBroker, user: str) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", broker.port, username=user, password=password(user),
                          protocol=aiomqtt.ProtocolVersion.V5)


def file_exists(path: str) -> bool:
    return Path(path).exists()


def read_env_file(path: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in Path(path).read_text().splitlines())


def assert_no_password(*texts: str) -> None:
    for text in texts:
        for user in ROLES:
            assert password(user) not in text, f"the password of {user} leaked"


async def test_run_worker_and_subscribe_log_in_and_players_speak_only_for_themselves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    db = tmp_path / "sec.db"
    with secured_broker() as broker:
        plain = f"mqtt://127.0.0.1:{broker.port}"
        worker = await start_npcsim("worker", "--broker", plain, "--run", "sec", "--name", "w1",
                                    env=broker.env_for("worker"))
        viewer = await start_npcsim("subscribe", "--broker", plain, "--run", "sec", "--wait",
                                    env=broker.env_for("alice"))
        try:
            assert worker.stdout is not None and viewer.stdout is not None
            await read_until(worker.stdout, b"ready")
            stats = RunStats()
            ready = asyncio.Event()
            config = RunConfig(
                scenario=VILLAGE, run_id="sec", ticks=40, tick_ms=50, broker=BrokerConfig(url=broker.url_for("shard")),
                inference=InferenceConfig(placement="remote"), record=RecordConfig(db=str(db)),
            )
            async with asyncio.TaskGroup() as group:
                job = group.create_task(run(config, stats=stats, on_ready=lambda _: ready.set()))
                await ready.wait()
                async with client(broker, "alice") as alice:
                    await alice.publish(topics.player_input("sec", "alice"),
                                        json.dumps({"to": "innkeeper", "text": "alice-asks-for-ale"}), qos=1)
                    await alice.publish(topics.player_input("sec", "bob"),
                                        json.dumps({"to": "innkeeper", "text": "impostor-speaks-for-bob"}), qos=1)
                said = await read_until(viewer.stdout, b"sec t")  # the viewer sees lines as they are said
                await job
        finally:
            worker_end = await ended(worker, within=15, terminate=True)
            viewer_end = await ended(viewer, within=15, terminate=True)
    assert stats.tick == 39 and stats.inferences > 0
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert not [r.fallback_reason for r in records if r.fallback_reason in ("timeout", "transport_error")], \
        "every inference was served by the logged-in worker"
    inputs = [r.player_input for r in records if r.agent_id == "innkeeper"]
    assert "alice: alice-asks-for-ale" in inputs
    assert not any("impostor" in text for text in inputs)
    assert "served" in worker_end.out
    assert_no_password(caplog.text, worker_end.out, worker_end.err, viewer_end.out, viewer_end.err, said.decode(),
                       stats.broker)


async def test_attacks_are_refused_or_counted_and_leave_no_forged_text(tmp_path: Path) -> None:
    db = tmp_path / "attack.db"
    with secured_broker() as broker:
        worker = RemoteWorker(WorkerConfig(broker=BrokerAddress.parse(broker.url_for("worker")), run_id="atk",
                                           name="w"))
        stats = RunStats()
        ready = asyncio.Event()
        config = RunConfig(
            scenario=VILLAGE, run_id="atk", ticks=30, tick_ms=100, broker=BrokerConfig(url=broker.url_for("shard")),
            inference=InferenceConfig(placement="remote"), record=RecordConfig(db=str(db)),
        )
        forged_notice = Notice(id="atk:guard_captain:5:0", tick=5, text=FORGED)
        forged_speech = Speech(id="atk:guard_captain:6:0", tick=6, speaker="guard_captain", text=FORGED,
                               to="snack_machine")
        async with asyncio.TaskGroup() as group:
            serving = group.create_task(worker.run())
            job = group.create_task(run(config, stats=stats, on_ready=lambda _: ready.set()))
            await ready.wait()
            async with client(broker, "alice") as alice, client(broker, "game") as game:
                batch = encode_batch(EventBatch(shard="0", tick=1, events=(forged_notice, forged_speech)))
                await alice.publish(topics.location_events("atk", "square"), batch, qos=1)
                await alice.publish(topics.agent_inbox("atk", "snack_machine"), batch, qos=1)
                reply = InferenceResult(id="x", agent_id="snack_machine", tick=1, line=FORGED * 180,
                                        raw_response=FORGED, backend="scripted", model="")
                await alice.publish(topics.infer_response("atk", "0"), encode_result(reply), qos=1)
                await alice.publish(topics.world_state("atk"), json.dumps({"state": {"king": FORGED}}), qos=1)
                await game.publish(topics.world_state("atk"), json.dumps({"state": {"king": "Z" * 1_000_000}}), qos=1)
                many = {f"k{i}": "v" for i in range(20_000)}
                await game.publish(topics.world_state("atk"), json.dumps({"state": many}), qos=1)
                for n in range(50):
                    await alice.publish(topics.player_input("atk", "alice"),
                                        json.dumps({"to": "snack_machine", "text": f"flood {n}"}), qos=1)
            await job
            serving.cancel()
    assert stats.tick == 29
    bus = stats.bus
    assert bus.refused["world state over its bounds"] == 2
    assert bus.refused["player inputs over the per-tick bound"] >= 47 - 3 * 29
    assert stats.player_inputs <= 3 * 30 + 30  # the scripted player's lines plus at most 3 of alice's per tick
    summary = "\n".join(f"{name}\t{value}" for name, value in summary_rows(stats))
    assert "refused: world state over its bounds" in summary and "refused: player inputs over the" in summary
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert records
    for record in records:
        text = json.dumps([[(a.prompt, a.raw_response) for a in record.attempts], record.line, record.player_input,
                           [f.value for f in record.state.world_state]])
        assert FORGED not in text and "ZZZZZZZZ" not in text and "k19999" not in text
    raw = db.read_bytes() + (db.with_name(db.name + "-wal").read_bytes() if db.with_name(db.name + "-wal").exists()
                             else b"")
    assert FORGED.encode() not in raw


def test_a_wrong_password_is_one_line_without_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    with secured_broker() as broker:
        bad = f"mqtt://worker:not-{password('worker')}@127.0.0.1:{broker.port}"
        assert main(["worker", "--broker", bad, "--run", "r"]) == 2
        assert main(["run", VILLAGE, "--broker", bad, "--quiet", "--ticks", "1"]) == 2
        assert main(["subscribe", "--broker", bad]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("npcsim: error:")]
    assert len(lines) == 3 and all("refused the login of user 'worker'" in line for line in lines)
    assert "Traceback" not in err and password("worker") not in err


def test_loadtest_logs_in_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.json"
    with secured_broker() as broker:
        for name, value in broker.env_for("shard").items():
            monkeypatch.setenv(name, value)
        code = main(["loadtest", "--agents", "50", "--requests", "40", "--concurrency", "4", "--processes", "0",
                     "--broker", f"mqtt://127.0.0.1:{broker.port}", "--json", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())
    assert figures["inferences"] == 40 and figures["fallbacks"] == 0


async def test_the_broker_restarted_mid_run_under_remote_workers(
    mosquitto: MosquittoProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "restart.db"
    worker = RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id="rs", name="w"))
    argv = ["run", VILLAGE, "--broker", mosquitto.url, "--run-id", "rs", "--ticks", "40", "--tick-ms", "100",
            "--remote-workers", "--quiet", "--db", str(db)]
    async with asyncio.TaskGroup() as group:
        serving = group.create_task(worker.run())
        await worker.ready.wait()
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as watcher:
            await watcher.subscribe("npcsim/rs/agent/+/say", qos=1)
            job = group.create_task(asyncio.to_thread(main, argv))
            async with asyncio.timeout(60):
                async for _ in watcher.messages:
                    break  # the run is under way
        mosquitto.stop()
        await elapse(3)  # the subject: the broker is down for 3 s under a running shard and worker
        mosquitto.start()
        async with asyncio.timeout(90):
            code = await job
        serving.cancel()
    assert code == 0
    with open_reader(db) as reader:
        assert reader.last_tick() == 39
    assert "is back" in caplog.text


async def test_an_anonymous_broker_is_announced_once_unless_a_run_key_is_given(
    mosquitto: MosquittoProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await run(RunConfig(scenario=VILLAGE, run_id="anon", ticks=2, broker=BrokerConfig(url=mosquitto.url)))
    assert caplog.text.count("can forge internal events") == 1
    caplog.clear()
    key = tmp_path / "run.key"
    key.write_text("0123456789abcdef0123456789abcdef\n")
    stats = await run(RunConfig(
        scenario=VILLAGE, run_id="keyed", ticks=4, broker=BrokerConfig(url=mosquitto.url, run_key_file=str(key)),
    ))
    assert "can forge" not in caplog.text
    assert stats.bus.events_delivered > 0 and not stats.bus.refused  # its own signed batches pass


@pytest.mark.parametrize(("content", "fragment"), [(None, "No such file"), (b"short", "need at least 16")])
def test_a_bad_run_key_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, fragment: str
) -> None:
    key = tmp_path / "run.key"
    if content is not None:
        key.write_bytes(content)
    assert main(["worker", "--broker", "mqtt://127.0.0.1:1", "--run", "r", "--run-key-file", str(key)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--run-key-file" in err and fragment in err


async def test_remote_workers_join_a_private_auto_broker_with_the_logged_login_and_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    require_mosquitto()
    stats = RunStats()
    ready = asyncio.Event()
    config = RunConfig(
        scenario=VILLAGE, run_id="joined", ticks=30, tick_ms=100, broker=BrokerConfig(url="auto"),
        inference=InferenceConfig(placement="remote", inference_timeout=5.0),
    )
    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stats=stats, on_ready=lambda _: ready.set()))
        await ready.wait()
        join = next(r.getMessage() for r in caplog.records if "remote workers join this run" in r.getMessage())
        match = re.search(r"\. (\S+worker-login\.env); .* --broker (\S+) --run joined --run-key-file (\S+)`", join)
        assert match, join
        login = read_env_file(match[1])
        assert login["NPCSIM_MQTT_USERNAME"] == "worker" and login["NPCSIM_MQTT_PASSWORD"] not in caplog.text
        worker = RemoteWorker(WorkerConfig(broker=BrokerAddress.parse(match[2], env=login), run_id="joined",
                                           name="joiner", run_key=load_run_key(match[3])))
        serving = group.create_task(worker.run())
        await job
        served = worker.statistics().completed
        serving.cancel()
    assert stats.tick == 29 and served > 0
    assert not any(map(file_exists, (match[1], match[3]))), "the login and key outlive the run"


async def test_pre_empted_ids_on_an_anonymous_broker_silence_nobody(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """An outsider publishes Notices carrying the future ids of two NPCs before they speak."""
    db = tmp_path / "preempt.db"
    stats = RunStats()
    ready = asyncio.Event()
    config = RunConfig(
        scenario=VILLAGE, run_id="pre", ticks=30, tick_ms=20, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    )
    future_ids = [f"pre:{npc}:{tick}:{seq}" for npc in ("guard_captain", "snack_machine")
                  for tick in range(30) for seq in range(1, 31)]
    notices = tuple(Notice(id=i, tick=0, text="shh") for i in future_ids)
    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stats=stats, on_ready=lambda _: ready.set()))
        await ready.wait()
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as outsider:
            # a batch of a tick the run has passed is dropped as a re-send (sim.protocol.router), so the
            # flood claims the last tick, to reach the mailboxes
            await outsider.publish(topics.location_events("pre", "square"),
                                   encode_batch(EventBatch(shard="0", tick=29, events=notices)), qos=1)
        await job
    assert stats.bus.duplicates == 0, "a real line was dropped as a duplicate of a forged one"
    assert stats.bus.mailbox_overflow > 0  # the flood lost its own excess...
    with open_reader(db) as reader:
        heard = {line.speaker for r in reader.audit_records("snack_machine") for line in r.state.dialogue}
    assert "guard_captain" in heard  # ...and the guard captain was still heard


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


_ESCAPE = "Hi \x1b[2J\x1b[1;31mSECURITY ALERT\x1b[0m \u202eevil\u200b \x07"


@pytest.mark.parametrize("reply", [_ESCAPE, "Hello\x1b[31m RED \x1b[0m\x07\x00 bell\u202e tfel"])
async def test_no_escape_sequence_reaches_the_say_topic_or_the_audit(
    mosquitto: MosquittoProcess, tmp_path: Path, reply: str
) -> None:
    """A model that echoes the player's escape sequences, or answers with its own (the issue's): cleaned."""
    db = tmp_path / "esc.db"
    config = RunConfig(
        scenario=VILLAGE, run_id="esc", ticks=100_000, tick_ms=50, broker=BrokerConfig(url=mosquitto.url),
        inference=InferenceConfig(backend_options={"script": [reply]}), record=RecordConfig(db=str(db)),
    )
    said: list[dict[str, object]] = []
    stop, ready = asyncio.Event(), asyncio.Event()
    escape = _ESCAPE
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as listener, asyncio.TaskGroup() as group:
        await listener.subscribe("npcsim/esc/agent/+/say", qos=1)
        job = group.create_task(run(config, stop=stop, on_ready=lambda _s: ready.set()))
        await ready.wait()
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as player:
            for npc in ("innkeeper", "blacksmith"):
                await player.publish(topics.player_input("esc", "mallory"),
                                     json.dumps({"to": npc, "text": escape}), qos=1)
        try:
            async with asyncio.timeout(60):
                async for message in listener.messages:
                    payload = message.payload
                    said.append(json.loads(bytes(payload) if isinstance(payload, bytes | bytearray) else b"{}"))
                    if sum(1 for s in said if s["to"] == "mallory") >= 2 and len(said) >= 8:
                        break
        finally:
            stop.set()
        await job
    assert all(not _UNPRINTABLE.search(str(s["text"])) for s in said), said
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert any(escape in r.player_input for r in records)  # the NPC heard it whole ...
    assert records and all(not _UNPRINTABLE.search(r.line) for r in records)  # ... and said nothing raw
    assert any(r.attempts[-1].raw_response == reply and r.line for r in records)  # came raw, was said cleaned
