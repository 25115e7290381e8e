"""The model-server sweep of `npcsim loadtest` against a real HTTP server on loopback.

The fake OpenAI-compatible server runs in a thread with its own event loop (the CLI runs
its own with `asyncio.run`). It serves at most two requests at a time, each held back
0.8 s: a server whose batch is full at concurrency 2. Beyond it the server is never idle,
so the curve is flat there; at 2 the client's own time per request (tens of ms on a
loaded machine) stays far below the 10 % of the service time that would hide the knee.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.cli import main
from sim.inference.backends.llamacpp import missing_requirement
from tests.fake_openai import FakeOpenAI, open_fake_openai

CAPACITY = 2
DELAY_S = 0.8


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        async with open_fake_openai() as fake:
            fake.capacity, fake.delay_s = CAPACITY, DELAY_S
            holder.update(fake=fake, stop=stop, loop=asyncio.get_running_loop())
            started.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="fake-openai", daemon=True)
    thread.start()
    try:
        assert started.wait(30), "the fake OpenAI server did not start"
        yield holder["fake"]
    finally:
        if "loop" in holder:
            holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(30)
        assert not thread.is_alive()


def _loadtest(server: FakeOpenAI, out: Path, *extra: str, requests: int = 12) -> int:
    return main(["loadtest", "--agents", "100", "--requests", str(requests), "--processes", "0", "--backend",
                 "openai", "--base-url", server.base_url, "--json", str(out), *extra])


def test_sweep_names_the_knee_of_a_saturated_server(
    server: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep.json"
    assert _loadtest(server, out, "--concurrency", "2,8", requests=8) == 0
    figures = json.loads(out.read_text())
    sweep = figures["sweep"]
    assert [p["concurrency"] for p in sweep] == [2, 8]
    for point in sweep:
        assert point["inferences"] == 8 and point["fallbacks"] == 0
        assert point["prompt_tokens_per_s"] > 0 and point["completion_tokens_per_s"] > 0
        assert 0 < point["prompt_cache_share"] < 1  # the prompts share their start: the server's cache reuses it
        latency = point["latency"]
        assert latency["p50_ms"] <= latency["p95_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    # Concurrency 2 fills the server; beyond it requests only queue there.
    assert figures["budgets"][0]["knee_concurrency"] == CAPACITY
    assert sweep[1]["latency"]["p50_ms"] > sweep[0]["latency"]["p50_ms"]
    assert len(server.requests) == 16
    assert figures["violations"] == 0
    assert "knee at concurrency 2" in capsys.readouterr().out


def test_the_sweep_shows_the_limit_each_server_settled_on(
    server: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.delay_s = 0.0
    server.script = ["429", "429"]  # the first request's: the first phase's limit goes down
    out = tmp_path / "sweep.json"
    assert _loadtest(server, out, "--concurrency", "1,4") == 0
    figures = json.loads(out.read_text())
    ceiling = 4  # the largest level
    first, second = (point["server_limits"][server.base_url] for point in figures["sweep"])
    for limit in (first, second):
        assert 1 <= limit["min"] <= limit["final"] <= limit["max"] <= ceiling
    assert first["min"] < ceiling  # the 429s cut it
    run = figures["server_limits"][server.base_url]
    assert run == {"final": second["final"], "min": min(first["min"], second["min"]),
                   "max": max(first["max"], second["max"])}
    printed = capsys.readouterr().out
    assert f"in flight at most: {server.base_url}" in printed
    assert f"{first['final']} ({first['min']}-{first['max']})" in printed


def test_a_server_without_usable_usage_gives_no_token_rates(server: FakeOpenAI, tmp_path: Path) -> None:
    server.delay_s = 0.0
    server.usage = {"prompt_tokens": "many", "completion_tokens": -3}
    out = tmp_path / "sweep.json"
    assert _loadtest(server, out, "--concurrency", "1,4") == 0
    for point in json.loads(out.read_text())["sweep"]:
        assert point["prompt_tokens_per_s"] is None and point["completion_tokens_per_s"] is None
        assert point["prompt_cache_share"] is None
        assert point["fallbacks"] == 0 and point["inferences"] == 12


def test_a_failing_server_shows_as_fallbacks_not_a_crash(server: FakeOpenAI, tmp_path: Path) -> None:
    server.delay_s = 0.0
    server.default = "malformed"
    out = tmp_path / "sweep.json"
    assert _loadtest(server, out, "--concurrency", "1,2") == 0  # fallbacks are not violations
    for point in json.loads(out.read_text())["sweep"]:
        assert point["fallbacks"] == point["inferences"] == 12
        assert point["completion_tokens_per_s"] is None


_missing_llm = missing_requirement()


@pytest.mark.skipif(_missing_llm is not None, reason=_missing_llm or "")
def test_sweep_with_the_real_small_model(tmp_path: Path) -> None:
    """SmolLM2 through llama.cpp (extra `llm`): the same sweep on a real model, a few requests per level."""
    out = tmp_path / "smol.json"
    code = main(["loadtest", "--agents", "50", "--requests", "4", "--processes", "0", "--backend", "llamacpp",
                 "--concurrency", "1,2", "--json", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())
    assert [p["concurrency"] for p in figures["sweep"]] == [1, 2]
    for point in figures["sweep"]:
        assert point["inferences"] == 4 and point["inferences_per_s"] > 0
        assert point["latency"]["p50_ms"] > 0
    assert figures["violations"] == 0
