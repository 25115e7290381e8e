"""The black box: every attempt of every inference is recorded and readable, whatever happened."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sim.audit import Response, attempt_prompt, make_record
from sim.cli import main
from sim.inference import InferenceRequest, InferenceResult, PoolConfig, open_pool
from sim.memory import WorkingMemoryConfig, build_working_memory
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, hot_limit, run
from sim.store import Writer, open_reader, open_store
from tests.audit_records import store_instead
from tests.fake_openai import FakeOpenAI, open_fake_openai
from tests.helpers import VILLAGE, MosquittoProcess
from tests.inference_helpers import make_request, smith_state


async def _record(db: Path, request: InferenceRequest, result: InferenceResult) -> None:
    assert request.state is not None and request.config is not None
    response = Response(backend=result.backend, model=result.model, params=result.params,
                        line=result.line, fallback=result.fallback,
                        fallback_reason=result.fallback_reason, timings=result.timings, attempts=result.attempts)
    record = make_record(request.memory, id=request.id, run_id=request.run_id, state=request.state,
                         config=request.config, tick=request.tick, response=response)
    async with open_store(db) as store:
        await store.record(record)
        await store.end_tick(request.tick)


def _pool_config(server: FakeOpenAI, endpoint: str, **options: Any) -> PoolConfig:
    return PoolConfig(backend="openai", timeout=2.0,
                      options={"base_url": server.base_url, "endpoint": endpoint, "retries": 0, **options})


def _read_back(db: Path, record_id: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """show, replay and export the record; returns the exported attempts."""
    capsys.readouterr()
    assert main(["audit", "show", "--db", str(db), record_id]) == 0
    shown = capsys.readouterr().out
    assert "replay identical" in shown and ("attempts" in shown or "no attempts recorded" in shown)
    assert main(["audit", "replay", "--db", str(db)]) == 0
    assert "all byte-identical" in capsys.readouterr().out
    assert main(["audit", "list", "--db", str(db)]) == 0
    assert record_id in capsys.readouterr().out
    out = db.parent / f"{record_id}.jsonl"
    assert main(["audit", "export", "--db", str(db), "--out", str(out)]) == 0
    (exported,) = [json.loads(line) for line in out.read_text().splitlines()]
    attempts: list[dict[str, Any]] = exported["attempts"]
    for attempt in attempts:
        assert {"prompt", "raw_response", "problem"} <= attempt.keys()
    return attempts


@pytest.mark.parametrize(
    ("outcome", "script", "default", "endpoint", "reason", "problems", "raws"),
    [
        ("accepted", ["ok"], "ok", "chat", None, [None], ["Aye, the forge is hot today."]),
        ("rejected-then-accepted", ["empty", "ok"], "ok", "completions", None, ["empty", None],
         ["", "Aye, the forge is hot today."]),
        ("rejected-twice", ["empty", "empty"], "ok", "chat", "rejected", ["empty", "empty"], ["", ""]),
        ("timeout", [], "hang", "chat", "timeout", ["timeout"], [None]),
        ("http-error", ["500"], "ok", "completions", "backend_error", ["backend_error"], [None]),
    ],
)
async def test_every_outcome_is_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], outcome: str, script: list[str], default: str,
    endpoint: str, reason: str | None, problems: list[str | None], raws: list[str | None],
) -> None:
    db = tmp_path / "audit.db"
    async with open_fake_openai() as server:
        server.script, server.default = list(script), default
        async with open_pool(_pool_config(server, endpoint)) as pool:
            request = make_request(1)
            result = await pool.infer(request)
        sent = [r["body"] for r in server.requests]
    await _record(db, request, result)
    assert result.fallback_reason == reason
    attempts = _read_back(db, request.id, capsys)
    assert [a["problem"] and a["problem"].split(":")[0] for a in attempts] == problems
    assert [a["raw_response"] for a in attempts] == raws
    # what the server received is what the audit says the model was given
    given = ["\n\n".join(m["content"] for m in b["messages"]) if endpoint == "chat" else b["prompt"] for b in sent]
    assert [a["prompt"] for a in attempts] == given
    if len(attempts) == 2:
        assert "\n## Rule\n" in attempts[1]["prompt"] and "\n## Rule\n" not in attempts[0]["prompt"]


async def test_circuit_open_and_stale_are_readable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "audit.db"
    async with open_fake_openai() as server:
        server.default = "500"
        async with open_pool(_pool_config(server, "chat", breaker_failures=1, breaker_cooldown=60)) as pool:
            await pool.infer(make_request(0))  # opens the circuit
            open_request, stale_request = make_request(1), make_request(2, deadline_in=-1.0)
            opened = await pool.infer(open_request)
            stale = await pool.infer(stale_request)
    assert opened.fallback_reason == "circuit_open" and stale.fallback_reason == "stale"
    await _record(db, open_request, opened)
    attempts = _read_back(db, open_request.id, capsys)
    assert [a["problem"].split(":")[0] for a in attempts] == ["circuit_open"] and attempts[0]["raw_response"] is None
    db.unlink()
    await _record(db, stale_request, stale)
    assert _read_back(db, stale_request.id, capsys) == []





async def test_a_record_with_a_null_raw_response_and_no_attempts_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed inference's record: raw_response null, no attempts."""
    db = tmp_path / "failed.db"
    request = make_request(3)
    async with open_pool(PoolConfig(backend="scripted")) as pool:
        result = await pool.infer(request)
    await _record(db, request, result)
    assert request.state is not None and request.config is not None
    failed = make_record(
        build_working_memory(request.state, request.memory.player_input), id=request.id, run_id="test",
        state=request.state, config=request.config, tick=3,
        response=Response(backend="openai", model="m", fallback=True, fallback_reason="backend_error"),
    )
    store_instead(db, failed)
    assert _read_back(db, request.id, capsys) == []


async def test_a_record_of_an_earlier_renderer_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Listed and exported as stored; never rendered another way to replay or show it."""
    db = tmp_path / "old.db"
    request = make_request(3)
    async with open_pool(PoolConfig(backend="scripted")) as pool:
        result = await pool.infer(request)
    await _record(db, request, result)
    with open_reader(db) as reader:
        record = reader.audit_record(request.id)
    store_instead(db, msgspec.structs.replace(record, renderer=2))
    capsys.readouterr()
    for command in ("replay", "show"):
        args = ["audit", command, "--db", str(db)] + ([request.id] if command == "show" else [])
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"audit record {request.id!r} was rendered by renderer 2, by an earlier npcsim" in err
        assert len(err.strip().splitlines()) == 1
    assert main(["audit", "list", "--db", str(db)]) == 0
    assert request.id in capsys.readouterr().out


@pytest.mark.mosquitto
async def test_village_against_a_server_answering_empty_every_other_call(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "village.db"
    async with open_fake_openai(reply="Four copper, friend.") as server:
        server.script = ["empty", "ok"] * 1000
        config = RunConfig(
            scenario=VILLAGE, run_id="empties", ticks=8, broker=BrokerConfig(url=mosquitto.url),
            inference=InferenceConfig(backend="openai", backend_options={"base_url": server.base_url}, concurrency=1),
            record=RecordConfig(db=str(db)),
        )
        stats = await run(config)
        sent = ["\n\n".join(m["content"] for m in r["body"]["messages"]) for r in server.requests]
    assert stats.inferences > 0
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    retried = [r for r in records if len(r.attempts) == 2]
    assert retried and all(r.attempts[0].problem == "empty" for r in retried)
    given = []
    for r in records:
        for a in r.attempts:
            memory = r.memory(a.prohibition)
            assert not memory.report.over_budget and len(memory.prompt) <= r.config.max_context_chars
            assert attempt_prompt(r, a) == a.prompt  # byte for byte
            given.append(a.prompt)
    assert sorted(given) == sorted(sent)  # every request the server saw is an attempt on record
    capsys.readouterr()
    assert main(["audit", "replay", "--db", str(db)]) == 0
    assert f"({sum(len(r.attempts) for r in records)} attempts checked)" in capsys.readouterr().out


@pytest.mark.mosquitto
async def test_a_hanging_server_is_a_counted_failure_that_opens_the_circuit(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    db = tmp_path / "hang.db"
    async with open_fake_openai() as server:
        server.default = "hang"
        config = RunConfig(
            scenario=VILLAGE, run_id="hang", ticks=6, broker=BrokerConfig(url=mosquitto.url),
            inference=InferenceConfig(backend="openai", inference_timeout=2.0,
                                      backend_options={"base_url": server.base_url, "breaker_failures": 2}),
            record=RecordConfig(db=str(db)),
        )
        stats = await run(config)
    assert stats.inferences > 0 and stats.fallbacks == stats.inferences
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    reasons = {r.fallback_reason for r in records}
    assert reasons <= {"timeout", "circuit_open"} and "circuit_open" in reasons  # the hangs were counted
    assert all(a.raw_response is None for r in records for a in r.attempts)


@pytest.mark.mosquitto
async def test_over_budget_prompts_are_counted_logged_once_per_npc_and_listed(
    mosquitto: MosquittoProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "tight.toml"
    scenario.write_text(Path(VILLAGE).read_text() + "\n[memory]\nmax_context_chars = 100\n")  # noqa: ASYNC240 - setup
    db = tmp_path / "tight.db"
    with caplog.at_level(logging.WARNING, logger="sim.shard"):
        stats = await run(RunConfig(
            scenario=str(scenario), run_id="tight", ticks=6, broker=BrokerConfig(url=mosquitto.url),
            record=RecordConfig(db=str(db)),
        ))
    assert stats.over_budget == stats.inferences > 0
    logged = [r.getMessage().split(":")[0] for r in caplog.records if "over budget" in r.getMessage()]
    assert logged and len(logged) == len(set(logged))  # once per NPC
    capsys.readouterr()
    assert main(["audit", "list", "--db", str(db)]) == 0
    listed = capsys.readouterr()
    assert f"{stats.inferences} over budget" in listed.err  # the count beside the records (in a pipe: stderr)
    assert [row.split("\t")[5] for row in listed.out.splitlines()] == ["yes"] * stats.inferences


async def test_hot_state_holds_what_the_caps_can_use(tmp_path: Path) -> None:
    from sim.memory import Line, build_working_memory

    config = WorkingMemoryConfig(max_dialogue_lines=50, max_context_chars=100_000)
    async with open_store(tmp_path / "hot.db", hot_limit=hot_limit(config)) as store:
        await store.ensure_agent(smith_state(), writer=Writer.SCENARIO)
        for n in range(60):
            await store.add_line("mara", Line(tick=10 + n, speaker="p", text=f"line {n}"), writer=Writer.NPC)
        wm = build_working_memory(store.state("mara"), "hi", config)
    assert wm.report.dialogue.kept == 50


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["run", VILLAGE, "--run-id", "a/b"], "--run-id"),
        (["run", VILLAGE, "--run-id", "a+b"], "--run-id"),
        (["run", VILLAGE, "--run-id", "#"], "--run-id"),
        (["run", VILLAGE, "--run-id", ""], "--run-id"),
        (["run", VILLAGE, "--ticks", "-5"], "--ticks"),
        (["run", VILLAGE, "--tick-ms", "-100"], "--tick-ms"),
        (["run", VILLAGE, "--set", "inference.inference_timeout=0"], "inference.inference_timeout"),
        (["run", VILLAGE, "--set", "inference.backend_options.read_timeout=inf"], "read_timeout"),
        (["run", VILLAGE, "--set", "inference.backend_options.connect_timeout=x"], "connect_timeout"),
        (["run", VILLAGE, "--set", "inference.concurrency=0"], "inference.concurrency"),
        (["scenario", "generate", "--npcs", "0", "--locations", "1", "--out", "x.toml"], "--npcs"),
        (["worker", "--broker", "mqtt://127.0.0.1:1", "--run", "a/b"], "--run"),
        (["worker", "--broker", "mqtt://127.0.0.1:1", "--run", "a", "--group", "x#"], "--group"),
        (["memory", "show", VILLAGE, "--tight", "-5"], "--tight"),
        (["run", VILLAGE, "--seed", "x"], "--seed"),
        (["scenario", "generate", "--npcs", "2", "--locations", "1", "--out", "/no/such/dir/x.toml"], "--out"),
    ],
)
def test_bad_values_get_one_line_and_exit_code_2(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and option in err and "Traceback" not in err, err


@pytest.mark.parametrize(("field", "value"), [("ticks", -5), ("tick_ms", -100), ("inference_timeout", 0.0),
                                              ("concurrency", 0), ("bots", -1)])
def test_run_config_refuses_what_the_cli_refuses(field: str, value: float) -> None:
    from sim.errors import ConfigError

    named = f"inference.{field}" if field in InferenceConfig.__struct_fields__ else f"--{field.replace('_', '-')}"
    with pytest.raises(ConfigError, match=f"{named} must be"):
        if field in InferenceConfig.__struct_fields__:
            RunConfig(scenario=VILLAGE, inference=InferenceConfig(**{field: value}))
        else:
            RunConfig(scenario=VILLAGE, **{field: value})


async def test_read_timeout_must_stay_below_the_inference_timeout() -> None:
    from sim.errors import ConfigError

    config = PoolConfig(backend="openai", timeout=2.0, options={"base_url": "http://127.0.0.1:9/v1", "read_timeout": 2})
    with pytest.raises(ConfigError, match=r"read_timeout 2\.0 must be below the inference timeout 2\.0"):
        async with open_pool(config):
            pass


def test_a_request_still_decodes_with_its_state() -> None:
    from sim.inference import decode_request, encode_request

    request = make_request()
    assert decode_request(encode_request(request)) == request
    assert msgspec.structs.replace(request, state=None, config=None) == decode_request(
        encode_request(msgspec.structs.replace(request, state=None, config=None))
    )
