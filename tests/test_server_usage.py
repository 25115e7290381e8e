"""What a server says each call cost and which model answered, in the audit; and the context
window a run's token budget must fit (the fake OpenAI-compatible server, real loopback HTTP).

The same against llama.cpp's own server and a real model: tests/test_llama_server.py.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from sim.cli.run import summary_rows
from sim.errors import ConfigError
from sim.inference import PoolConfig, check_context_window, decode_result, open_pool
from sim.inference.backends.llamacpp import served_now
from sim.metrics import Metrics, serve_metrics
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader
from sim.wire.attempt import ServedBy, Usage
from tests.fake_openai import FakeOpenAI, open_fake_openai
from tests.helpers import VILLAGE, MosquittoProcess, run_npcsim
from tests.inference_helpers import make_request
from tests.test_metrics import scrape


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with open_fake_openai() as server:
        yield server


def config(fake: FakeOpenAI, **options: Any) -> PoolConfig:
    base: dict[str, Any] = {"base_url": fake.base_url, "model": "fake-1", "retries": 0}
    return PoolConfig(backend="openai", options={**base, **options}, concurrency=1, timeout=5.0)


async def test_each_attempt_keeps_the_prompt_tokens_reused_and_the_model_that_answered(fake: FakeOpenAI) -> None:
    async with open_pool(config(fake)) as pool:
        first = await pool.infer(make_request(1))
        again = await pool.infer(make_request(2))
    (one,), (two,) = first.attempts, again.attempts
    sent = " ".join(m["content"] for m in fake.requests[0]["body"]["messages"]).split()
    assert one.usage == Usage(prompt_tokens=len(sent), cached_tokens=0, completion_tokens=6)
    assert two.usage is not None and two.usage.prompt_tokens == len(sent)
    assert two.usage.cached_tokens == len(sent) and two.usage.evaluated_tokens == 0  # the same prompt again
    assert one.served_by == ServedBy(model="fake-1", build="fake-build-1", server=fake.base_url)


async def test_llama_cpp_timings_count_the_prompt_evaluated_and_reused(fake: FakeOpenAI) -> None:
    fake.timings = {"prompt_n": 12, "cache_n": 30, "prompt_ms": 41.5, "predicted_n": 6, "predicted_ms": 120}
    async with open_pool(config(fake, endpoint="completions")) as pool:
        result = await pool.infer(make_request())
    assert result.attempts[0].usage == Usage(
        prompt_tokens=42, cached_tokens=30, completion_tokens=6, prompt_ms=41.5, predicted_ms=120.0
    )


@pytest.mark.parametrize(("usage", "timings", "expected"), [
    ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 11}}, None, Usage(prompt_tokens=10)),
    ({"prompt_tokens": "10", "completion_tokens": -1, "prompt_tokens_details": [3]}, None, Usage()),
    ({"prompt_tokens": True, "prompt_tokens_details": {"cached_tokens": 1.5}}, None, Usage()),
    ({}, {"prompt_n": 5, "cache_n": None, "prompt_ms": "fast", "predicted_ms": -3}, Usage()),
    ({}, {"prompt_n": 5, "cache_n": 2, "prompt_ms": [1]}, Usage(prompt_tokens=7, cached_tokens=2)),
    ("none", "none", Usage()),
])
async def test_a_forged_or_malformed_usage_is_not_recorded(
    fake: FakeOpenAI, usage: Any, timings: Any, expected: Usage
) -> None:
    """More tokens reused than the prompt had, counts that are not counts: None, never guessed."""
    fake.usage, fake.timings = usage, timings
    async with open_pool(config(fake)) as pool:
        result = await pool.infer(make_request())
    assert not result.fallback and result.attempts[0].usage == expected


async def test_a_model_name_or_build_too_long_to_be_one_is_not_recorded(fake: FakeOpenAI) -> None:
    fake.fingerprint = "b" * 10_000
    async with open_pool(config(fake, model="m" * 300)) as pool:
        result = await pool.infer(make_request())
    assert not result.fallback and result.attempts[0].served_by == ServedBy(server=fake.base_url)


async def test_no_reply_no_usage(fake: FakeOpenAI) -> None:
    fake.default = "500"
    async with open_pool(config(fake)) as pool:
        result = await pool.infer(make_request())
    assert result.fallback and result.attempts[0].usage is None and result.attempts[0].served_by is None


async def test_a_token_budget_over_the_servers_window_is_refused(fake: FakeOpenAI) -> None:
    fake.n_ctx = 512
    options = {"base_url": fake.base_url, "max_tokens": 64}
    await check_context_window("openai", options, 448)  # 448 + 64 fits exactly
    with pytest.raises(ConfigError) as refused:
        await check_context_window("openai", options, 449)
    assert str(refused.value) == (
        f"max_context_tokens 449 + max_tokens 64 = 513 tokens cannot fit the server's context window of 512 tokens "
        f"per slot ({fake.base_url})"
    )
    assert fake.gets == ["/props", "/props"]


async def test_without_a_token_budget_or_a_window_nothing_is_checked(fake: FakeOpenAI) -> None:
    await check_context_window("openai", {"base_url": fake.base_url}, None)
    assert fake.gets == []
    await check_context_window("openai", {"base_url": fake.base_url}, 10**9)  # /props and /slots: 404
    assert fake.gets == ["/props", "/slots"]
    await check_context_window("openai", {"base_url": "http://127.0.0.1:1/v1"}, 10**9)  # nobody there


async def test_a_run_over_the_servers_window_stops_before_it_starts_in_one_line(fake: FakeOpenAI) -> None:
    fake.n_ctx = 256
    ran = await asyncio.to_thread(
        run_npcsim, "run", VILLAGE, "--backend", "openai", "--base-url", fake.base_url,
        "--set", "memory.max_context_tokens=300", "--ticks", "1", "--broker", "mqtt://127.0.0.1:1",
    )
    assert ran.code != 0 and not fake.requests
    assert ran.err.strip().splitlines() == [
        f"npcsim: error: max_context_tokens 300 + max_tokens 64 = 364 tokens cannot fit the server's context window "
        f"of 256 tokens per slot ({fake.base_url})"
    ]


@pytest.mark.mosquitto
async def test_a_run_counts_the_prompt_tokens_evaluated_and_reused_and_replay_names_another_model(
    fake: FakeOpenAI, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """The summary's and the metrics' counts are the audit's, over every attempt; `audit replay`
    given the backend says which records another model answered than the one it serves now."""
    db = tmp_path / "usage.db"
    config = RunConfig(
        scenario=VILLAGE, run_id="usage", ticks=12, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
        inference=InferenceConfig(backend="openai", backend_options={"base_url": fake.base_url, "retries": 0}),
    )
    metrics, stats = Metrics(), RunStats()
    await run(config, stats=stats, metrics=metrics)
    with open_reader(db) as reader:
        attempts = [a for r in reader.audit_records() for a in r.attempts]
        records = sum(1 for _ in reader.audit_records())
        first_id = next(iter(reader.audit_records())).id
    usages = [a.usage for a in attempts if a.usage is not None]
    assert usages
    cached = sum(u.cached_tokens or 0 for u in usages)
    evaluated = sum(u.evaluated_tokens or 0 for u in usages)
    assert cached > 0 and (stats.prompt_tokens_evaluated, stats.prompt_tokens_cached) == (evaluated, cached)
    with serve_metrics(metrics, 0) as port:
        async with httpx.AsyncClient() as client:
            families = scrape((await client.get(f"http://127.0.0.1:{port}/metrics")).text)["npcsim_prompt_tokens"]
    assert families[("npcsim_prompt_tokens_total", (("state", "evaluated"),))] == evaluated
    assert families[("npcsim_prompt_tokens_total", (("state", "cached"),))] == cached
    rows = dict(summary_rows(stats))
    assert rows["prompt tokens evaluated"] == f"{evaluated:,}" and rows["prompt tokens reused (cache)"] == f"{cached:,}"
    assert rows["prompt cache hit share"] == f"{100 * cached / (cached + evaluated):.1f}%"

    first = attempts[0]
    assert first.usage is not None and first.usage.prompt_tokens is not None
    show = await asyncio.to_thread(run_npcsim, "audit", "show", "--db", str(db), first_id)
    assert show.code == 0, show.err
    assert (f"attempt 1: usage: prompt {first.usage.prompt_tokens:,} tokens ({first.usage.cached_tokens:,} cached), "
            "completion 6; prompt ? ms, generation ? ms") in show.out.splitlines()
    assert f"attempt 1: served by: model default, build fake-build-1, server {fake.base_url}" in show.out.splitlines()

    replay = ("audit", "replay", "--db", str(db), "--jobs", "1", "--backend", "openai", "--base-url", fake.base_url)
    same = await asyncio.to_thread(run_npcsim, *replay)
    assert same.code == 0, same.err
    said = "every record that names its model was answered by the one openai serves now (build fake-build-1)"
    assert said in same.out
    fake.fingerprint = "fake-build-2"  # the server was rebuilt since the run
    other = await asyncio.to_thread(run_npcsim, *replay)
    assert other.code == 0 and "all byte-identical" in other.out
    assert f"{records} of {records} records were answered by another model than the one openai serves now" in other.out
    assert f"served by model default, build fake-build-1, server {fake.base_url}; now: build fake-build-2" in other.out


def test_a_run_whose_server_says_nothing_shows_no_prompt_token_rows() -> None:
    assert not any(name.startswith("prompt") for name, _ in summary_rows(RunStats()))


def test_the_llamacpp_backend_names_its_model_file_by_its_digest(tmp_path: Path) -> None:
    weights = tmp_path / "tiny-model.gguf"
    weights.write_bytes(b"GGUF" + bytes(range(256)) * 5000)
    said = served_now({"model_path": str(weights)})
    assert said == ServedBy(model="tiny-model", sha256=hashlib.sha256(weights.read_bytes()).hexdigest())
    assert said.differs(ServedBy(model="tiny-model", sha256="0" * 64))
    assert not said.differs(ServedBy(model="tiny-model")) and not said.differs(ServedBy(build="b1"))
    with pytest.raises(ConfigError, match="is not a file"):
        served_now({"model_path": str(tmp_path / "missing.gguf")})


@pytest.mark.parametrize("usage", [{"prompt_tokens": -5}, {"cached_tokens": -1}, {"prompt_ms": -0.5},
                                   {"completion_tokens": 1.5}])
def test_a_remote_result_with_counts_that_are_not_counts_is_refused_on_the_wire(usage: dict[str, Any]) -> None:
    """A remote worker's result is decoded with the audit's types: a forged usage is a malformed message."""
    forged = msgspec.msgpack.encode({
        "id": "x", "agent_id": "a", "tick": 1, "line": "Aye.", "raw_response": "Aye.", "backend": "openai",
        "model": "m", "attempts": [{"prompt": "p", "raw_response": "Aye.", "usage": usage}],
    })
    with pytest.raises(msgspec.ValidationError, match=r"\$\.attempts\[0\]\.usage\."):
        decode_result(forged)


def test_more_tokens_reused_than_the_prompt_had_are_no_tokens_evaluated() -> None:
    assert Usage(prompt_tokens=3, cached_tokens=5).evaluated_tokens is None
    assert Usage(prompt_tokens=5, cached_tokens=5).evaluated_tokens == 0
