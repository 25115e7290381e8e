"""A run keeps its state and audit in SQLite: replay is byte-exact, --resume continues."""

from __future__ import annotations

import asyncio
import fnmatch
from pathlib import Path

import aiomqtt
import msgspec
import pytest

from sim.audit import AuditRecord
from sim.cli import main
from sim.errors import ConfigError
from sim.generate import generate_scenario
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, run
from sim.store import open_reader, open_store
from sim.wire import topics
from sim.wire.events import decode_say
from sim.wire.inputs import OutsideInput
from tests.helpers import REPO, VILLAGE, MosquittoProcess, eventually

pytestmark = pytest.mark.mosquitto

GITIGNORE = REPO / ".gitignore"


async def test_run_records_every_inference_and_resumes(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    db = tmp_path / "village.db"
    config = RunConfig(
        scenario=VILLAGE, run_id="kept", ticks=8, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    )
    first = await run(config)
    assert first.inferences > 0
    with open_reader(db) as reader:
        assert reader.last_tick() == 7
        assert len(reader.audit_summaries()) == first.inferences

    with pytest.raises(ConfigError, match=r"already holds this run up to tick 7: pass --resume"):
        await run(config)

    second = await run(RunConfig(
        scenario=VILLAGE, run_id="kept", ticks=6, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db), resume=True),
    ))
    assert (second.first_tick, second.tick) == (8, 13)
    with open_reader(db) as reader:
        assert reader.last_tick() == 13
        assert len(reader.audit_summaries()) == first.inferences + second.inferences
        smith = [r for r in reader.audit_records("snack_machine")]
    assert smith and all("capitalist snack machine" in r.attempts[0].prompt for r in smith)
    assert main(["audit", "replay", "--db", str(db)]) == 0


async def test_a_refused_resume_creates_no_file(tmp_path: Path) -> None:
    """--resume of a missing store, or of one that holds no tick, is refused before anything
    opens: no store, no arrivals journal, no key, no lock appears beside it (no broker is reached)."""
    missing = tmp_path / "new.db"
    config = RunConfig(scenario=VILLAGE, ticks=2, broker=BrokerConfig(url="mqtt://127.0.0.1:1"),
                       record=RecordConfig(db=str(missing), resume=True))
    with pytest.raises(ConfigError, match=r"--resume: .*new.db: no such file"):
        await run(config)
    assert names(tmp_path) == []

    empty = tmp_path / "empty.db"
    async with open_store(empty):
        pass
    for sibling in names(tmp_path):  # what the store's opening left beside it
        if sibling != "empty.db":
            (tmp_path / sibling).unlink()
    with pytest.raises(ConfigError, match=r"--resume: .*empty.db holds no committed tick"):
        await run(msgspec.structs.replace(config, record=RecordConfig(db=str(empty), resume=True)))
    assert names(tmp_path) == ["empty.db"]


async def test_game_system_sets_world_state_over_mqtt(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    """The retained world/state topic is the game system's: NPCs' prompts follow it."""
    db = tmp_path / "world.db"
    stop = asyncio.Event()
    ready = asyncio.Event()
    config = RunConfig(
        scenario=VILLAGE, run_id="w1", ticks=400, tick_ms=20, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    )
    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stop=stop, on_ready=lambda _: ready.set()))
        await ready.wait()
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.publish(topics.world_state("w1"), b"not json", qos=1)
            await client.publish(topics.world_state("w1"), b'{"state": {"king": "crowned: Queen Ysolde"}}',
                                 qos=1, retain=True)
            await client.subscribe(topics.agent_say("w1", "innkeeper"), qos=1)
            # the world state takes effect at the tick after shard 0's TickDone took it, and a
            # question is answered at once: the second question comes after the change
            for question in (b'{"to": "innkeeper", "text": "News?"}', b'{"to": "innkeeper", "text": "More news?"}'):
                await client.publish(topics.player_input("w1", "visitor"), question, qos=1)
                async with asyncio.timeout(10):
                    async for message in client.messages:
                        if b'"to":"visitor"' in bytes(message.payload):  # type: ignore[arg-type]
                            break
        # a stop in the middle of a tick rolls it back, the line it said already too: the
        # answer is on disk before the run is stopped
        latest = await eventually(lambda: len(answers(db, "innkeeper", "visitor")) >= 2 and answers(
            db, "innkeeper", "visitor"), what="the answers on disk")
        stop.set()
        stats = await job
    assert stats.world_changes == 1  # one publish of one key, whatever the number of NPCs holding it
    assert stats.bus.malformed.get("world state") == 1
    assert "king: crowned: Queen Ysolde" in latest[-1].attempts[0].prompt
    assert "king: dead" not in latest[-1].attempts[0].prompt


def answers(db: Path, agent: str, player: str) -> list[AuditRecord]:
    """`agent`'s records on disk that answer `player`."""
    with open_reader(db) as reader:
        return [r for r in reader.audit_records(agent) if r.player_input.startswith(f"{player}: ")]


async def test_village_runs_against_an_openai_compatible_server(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    """`--backend openai --base-url ...`: every line comes from the server, the audit says so."""
    from tests.fake_openai import open_fake_openai

    db = tmp_path / "openai.db"
    async with open_fake_openai(reply="Aye, the forge is hot today.") as server:
        stats = await run(RunConfig(
            scenario=VILLAGE, run_id="oa", ticks=6, broker=BrokerConfig(url=mosquitto.url),
            inference=InferenceConfig(backend="openai",
                                      backend_options={"base_url": server.base_url, "model": "fake-1"}),
            record=RecordConfig(db=str(db), keep_dialogue=True),
        ))
        prompts = [r["body"]["messages"][0]["content"] for r in server.requests]
    assert stats.inferences > 0 and stats.fallbacks == 0
    assert {say.text for say in stats.dialogue} == {"Aye, the forge is hot today."}
    assert any("capitalist snack machine" in prompt for prompt in prompts)
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert records and {(r.backend, r.model) for r in records} == {("openai", "fake-1")}
    assert main(["audit", "replay", "--db", str(db)]) == 0


async def test_outside_input_is_stored_with_its_tick(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    db = tmp_path / "inputs.db"
    stop = asyncio.Event()
    ready = asyncio.Event()
    config = RunConfig(
        scenario=VILLAGE, run_id="in1", ticks=500, tick_ms=20, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    )
    async with asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stop=stop, on_ready=lambda _: ready.set()))
        await ready.wait()
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe(topics.agent_say("in1", "innkeeper"), qos=1)
            await client.publish(topics.player_input("in1", "visitor"), b'{"to": "innkeeper", "text": "Ale!"}', qos=1)
            async with asyncio.timeout(30):
                async for message in client.messages:
                    say = decode_say(bytes(message.payload))  # type: ignore[arg-type]
                    if say.to == "visitor":
                        break
        stop.set()
        await job
    async with open_store(db) as store:  # answered in the tick that took it
        assert await store.resume.inputs(say.tick) == [OutsideInput(seq=0, player="visitor", to="innkeeper",
                                                                     text="Ale!")]


async def test_resume_to_a_horizon(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    db = tmp_path / "horizon.db"
    base = RunConfig(
        scenario=VILLAGE, run_id="h1", until_tick=8, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    )
    first = await run(base)
    assert (first.first_tick, first.tick) == (0, 7)
    again = await run(RunConfig(
        scenario=VILLAGE, run_id="h1", until_tick=14, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db), resume=True),
    ))
    assert (again.first_tick, again.tick) == (8, 13)
    done = await run(RunConfig(
        scenario=VILLAGE, run_id="h1", until_tick=14, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db), resume=True),
    ))
    assert (done.first_tick, done.tick, done.inferences) == (14, 13, 0)
    with open_reader(db) as reader:
        assert reader.last_tick() == 13
    with pytest.raises(ConfigError, match="--ticks 3 and --until-tick 14: give one of them"):
        await run(RunConfig(
            scenario=VILLAGE, ticks=3, until_tick=14, broker=BrokerConfig(url=mosquitto.url),
            record=RecordConfig(db=str(db)),
        ))


async def test_retention_prunes_memories_but_no_prompt_changes(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    """record.retain_memories at the hot window, across a resume: every prompt is as without it."""
    full, pruned = tmp_path / "full.db", tmp_path / "pruned.db"
    # a busy square: 30 NPCs in one place, each hears every line said there
    busy = str(tmp_path / "busy.toml")
    with open(busy, "w") as f:  # noqa: ASYNC230 - a test's setup, before anything runs
        f.write(generate_scenario(npcs=30, locations=1, ambient_chance=0.3))
    pruned_rows = 0
    for db, retain in ((full, None), (pruned, 32)):
        for resume in (False, True):
            stats = await run(RunConfig(
                scenario=busy, run_id="r", ticks=5, broker=BrokerConfig(url=mosquitto.url),
                record=RecordConfig(db=str(db), retain_memories=retain, resume=resume),
            ))
            pruned_rows += stats.memories_pruned
    assert pruned_rows > 0

    def prompts(db: Path) -> dict[str, str]:
        with open_reader(db) as reader:
            return {r.id: r.prompt_sha256 for r in reader.audit_records()}

    assert prompts(pruned) == prompts(full)
    assert main(["audit", "replay", "--db", str(pruned)]) == 0


def test_retention_below_the_hot_window_is_refused(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", VILLAGE, "--broker", mosquitto.url, "--ticks", "2", "--db", str(tmp_path / "v.db"), "--quiet"]
    assert main([*argv, "--set", "record.retain_memories=5"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "npcsim: error: record.retain_memories must be at least the store's hot window (32 items per category),"
        " got 5"
    )
    assert not (tmp_path / "v.db").exists()


def test_the_run_overrides_the_scenarios_budget(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--set memory.max_context_chars` and `memory.max_context_tokens` are the run's, over the scenario's
    [memory]."""
    db = tmp_path / "tight.db"
    argv = ["run", VILLAGE, "--broker", mosquitto.url, "--ticks", "3", "--quiet"]
    assert main([*argv, "--db", str(db), "--set", "memory.max_context_chars=700",
                 "--set", "memory.max_context_tokens=400"]) == 0
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert records and {(r.config.max_context_chars, r.config.max_context_tokens) for r in records} == {(700, 400)}
    assert all(r.report.prompt_chars <= 700 and (r.report.prompt_tokens or 0) <= 400 for r in records)
    assert main(["audit", "replay", "--db", str(db)]) == 0
    capsys.readouterr()
    for key, value in (("max_context_chars", "-1"), ("max_context_tokens", "many")):
        assert main([*argv, "--db", str(tmp_path / "no.db"), "--set", f"memory.{key}={value}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"npcsim: error: --set memory.{key}={value}: "), err
    with pytest.raises(ConfigError, match=r"^--set memory.max_context_tokens=many: Expected `int \| null`, got `str`$"):
        RunConfig(scenario=VILLAGE, memory={"max_context_tokens": "many"})


async def test_gitignore_covers_every_file_beside_a_store(tmp_path: Path) -> None:
    """What a run keeps beside its store (the run key, the arrivals journal, the lock, SQLite's
    own files), seen while it runs and after it, is ignored by the repository's .gitignore."""
    db = tmp_path / "village.db"
    seen: set[str] = set()

    def look(_: object) -> None:
        seen.update(names(tmp_path))

    await run(RunConfig(scenario=VILLAGE, ticks=2, record=RecordConfig(db=str(db))), on_ready=look)
    look(None)
    patterns = [line for line in GITIGNORE.read_text().splitlines() if line and line[0] not in "#/"]
    assert {"village.db", "village.db-arrivals", "village.db.key"} <= seen
    assert [name for name in sorted(seen) if not any(fnmatch.fnmatch(name, p) for p in patterns)] == []


def names(directory: Path) -> list[str]:
    """The names of the files in `directory`, sorted."""
    return sorted(p.name for p in directory.iterdir())
