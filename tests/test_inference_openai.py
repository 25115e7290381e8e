"""The `openai` backend against a fake OpenAI-compatible server over real loopback HTTP."""

from __future__ import annotations

import asyncio
import sys
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sim.backoff import BackoffPolicy
from sim.errors import CircuitOpenError
from sim.inference import PoolConfig, open_pool, reply_problem
from sim.inference._serve import RAW_EXCERPT_CHARS
from sim.inference.backends.openai import CircuitBreaker, OpenAIOptions, open_openai, reply_bound
from sim.output import Rules
from sim.store import open_reader
from tests.fake_openai import FakeOpenAI, open_fake_openai
from tests.helpers import REPO, MosquittoProcess
from tests.inference_helpers import make_request


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with open_fake_openai() as server:
        yield server


def config(fake: FakeOpenAI, **options: Any) -> PoolConfig:
    base: dict[str, Any] = {"base_url": fake.base_url, "model": "fake-1", "backoff_base": 0.01, "retries": 2}
    return PoolConfig(backend="openai", options={**base, **options}, concurrency=4, timeout=5.0)


async def test_chat_success_sends_the_working_memory(fake: FakeOpenAI) -> None:
    async with open_pool(config(fake, temperature=0.3, max_tokens=20, stop=["\n", "###"])) as pool:
        result = await pool.infer(make_request())
    assert not result.fallback and result.line == "Aye, the forge is hot today."
    assert result.backend == "openai" and result.model == "fake-1" and result.tokens == 6
    body = fake.requests[0]["body"]
    assert fake.requests[0]["path"] == "/v1/chat/completions"
    assert body["temperature"] == 0.3 and body["max_tokens"] == 20 and body["stop"] == ["\n", "###"]
    assert "The old bridge is broken." in body["messages"][0]["content"]
    assert body["messages"][1]["content"].endswith("## Now\ntraveller: Is the bridge safe to cross?")


async def test_completions_endpoint_sends_the_prompt(fake: FakeOpenAI) -> None:
    async with open_pool(config(fake, endpoint="completions")) as pool:
        result = await pool.infer(make_request())
    assert not result.fallback
    assert fake.requests[0]["path"] == "/v1/completions"
    assert fake.requests[0]["body"]["prompt"].endswith("mara:")


async def test_429_honours_retry_after_then_succeeds(fake: FakeOpenAI) -> None:
    fake.script = ["429", "429"]
    fake.retry_after = "0.2"
    async with open_pool(config(fake, backoff_base=5.0)) as pool:
        result = await pool.infer(make_request())
    # backoff_base=5 s would blow the 5 s pool timeout: only Retry-After (0.2 s) lets this pass
    assert not result.fallback
    assert fake.modes == ["429", "429", "ok"]


async def test_500_is_retried_and_gives_the_fallback_when_it_persists(fake: FakeOpenAI) -> None:
    fake.script = ["500"]
    async with open_pool(config(fake)) as pool:
        recovered = await pool.infer(make_request(1))
        fake.default = "500"
        failed = await pool.infer(make_request(2))
    assert not recovered.fallback
    assert failed.fallback and failed.fallback_reason == "backend_error"
    assert fake.modes == ["500", "ok", "500", "500", "500"]


async def test_a_hang_hits_the_read_timeout(fake: FakeOpenAI) -> None:
    fake.default = "hang"
    async with open_pool(config(fake, read_timeout=0.2, retries=1)) as pool:
        result = await pool.infer(make_request())
    assert result.fallback and result.fallback_reason == "timeout"
    assert fake.modes == ["hang", "hang"]


async def test_a_hang_hits_the_pool_timeout(fake: FakeOpenAI) -> None:
    fake.default = "hang"
    cfg = PoolConfig(backend="openai", options={"base_url": fake.base_url}, timeout=0.3)
    async with open_pool(cfg) as pool:
        result = await pool.infer(make_request())
    assert result.fallback and result.fallback_reason == "timeout"


async def test_malformed_json_gives_the_fallback_without_retry(fake: FakeOpenAI) -> None:
    fake.script = ["malformed"]
    async with open_pool(config(fake)) as pool:
        bad = await pool.infer(make_request(1))
        good = await pool.infer(make_request(2))
    assert bad.fallback and bad.fallback_reason == "backend_error"
    assert not good.fallback
    assert fake.modes == ["malformed", "ok"]


async def test_circuit_breaker_opens_fails_fast_and_recovers(fake: FakeOpenAI) -> None:
    fake.default = "500"
    now = [0.0]  # the breaker's clock: the cooldown passes when the test says so
    cfg = config(fake, retries=0, breaker_failures=2, breaker_cooldown=10.0)
    async with (
        open_openai(cfg.options, cfg.concurrency, cfg.timeout, clock=lambda: now[0]) as backend,
        open_pool(cfg, backend=backend) as pool,
    ):
        first = [await pool.infer(make_request(n)) for n in range(2)]
        opened = await pool.infer(make_request(2))
        assert len(fake.requests) == 2  # failing fast: the open circuit sent nothing
        fake.default = "ok"
        now[0] = 9.9
        still_open = await pool.infer(make_request(3))
        assert len(fake.requests) == 2  # within the cooldown: still nothing sent
        now[0] = 10.0  # the cooldown is over: the next call is the probe
        probe = await pool.infer(make_request(4))
        after = await pool.infer(make_request(5))
    assert [r.fallback_reason for r in first] == ["backend_error", "backend_error"]
    assert opened.fallback and opened.fallback_reason == "circuit_open"
    assert still_open.fallback_reason == "circuit_open"
    assert not probe.fallback and not after.fallback and backend.breaker.state == "closed"


def test_the_backoff_options_are_the_one_backoffs_policy() -> None:
    options = OpenAIOptions(base_url="http://127.0.0.1:1", backoff_base=0.3, backoff_max=2.0)
    assert options.backoff == BackoffPolicy(initial=0.3, maximum=2.0)
    assert OpenAIOptions(base_url="http://127.0.0.1:1").backoff == BackoffPolicy(initial=0.2, maximum=5.0)


def test_circuit_breaker_states_on_a_virtual_clock() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures=2, cooldown=10.0, clock=lambda: now[0])
    breaker.failure()
    assert breaker.state == "closed"
    breaker.failure()
    assert breaker.state == "open"
    with pytest.raises(CircuitOpenError):
        breaker.before("x")
    now[0] = 10.0
    assert breaker.state == "half-open"
    breaker.before("x")  # the probe goes through ...
    with pytest.raises(CircuitOpenError):
        breaker.before("x")  # ... alone
    breaker.failure()  # the probe failed: open again for another cooldown
    assert breaker.state == "open"
    now[0] = 20.0
    breaker.before("x")
    breaker.abandon()  # a cancelled probe counts as failed
    assert breaker.state == "open"
    now[0] = 30.0
    breaker.before("x")
    breaker.success()
    assert breaker.state == "closed"


async def test_one_hundred_concurrent_requests(fake: FakeOpenAI) -> None:
    cfg = PoolConfig(backend="openai", options={"base_url": fake.base_url, "in_flight": 100}, concurrency=100,
                     max_in_flight=100)
    async with open_pool(cfg) as pool, asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(pool.infer(make_request(n, agent=f"a{n}"))) for n in range(100)]
    assert all(not t.result().fallback for t in tasks)
    assert len(fake.requests) == 100


async def test_api_key_comes_from_the_named_environment_variable(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPCSIM_TEST_KEY", "sekrit")
    async with open_pool(config(fake, api_key_env="NPCSIM_TEST_KEY")) as pool:
        result = await pool.infer(make_request())
    assert not result.fallback
    assert fake.requests[0]["headers"]["authorization"] == "Bearer sekrit"


async def test_a_50_mb_reply_is_read_no_further_than_the_bound(fake: FakeOpenAI) -> None:
    """A server that ignores max_tokens: the backend stops at the bound, a counted backend error."""
    fake.default = "huge"
    tracemalloc.start()
    try:
        async with open_pool(config(fake, max_tokens=64)) as pool:
            result = await pool.infer(make_request())
            statistics = pool.statistics()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.fallback and result.fallback_reason == "backend_error"
    assert statistics.fallbacks == {"backend_error": 1} and fake.modes == ["huge"]  # counted, not retried
    (attempt,) = result.attempts
    assert attempt.raw_response is None and f"over {reply_bound(64)} bytes" in (attempt.problem or "")
    assert peak < 8 * 1024 * 1024, peak  # the reply is 50 MB; the fake server's own chunk is 1 MiB of it
    assert reply_bound(64) < 100_000 and reply_bound(4096) < 2_000_000


async def test_a_long_reply_within_the_bound_is_kept_as_an_excerpt_with_its_size(fake: FakeOpenAI) -> None:
    fake.reply = "Aye, the forge is hot today.\n" + "x" * 60_000
    async with open_pool(config(fake, max_tokens=64)) as pool:
        result = await pool.infer(make_request())
    assert not result.fallback and result.line == "Aye, the forge is hot today."
    raw = result.raw_response or ""
    assert len(raw) < RAW_EXCERPT_CHARS + 100 and raw.startswith(fake.reply[:RAW_EXCERPT_CHARS])
    assert raw.endswith(f"[reply cut: {RAW_EXCERPT_CHARS} of {len(fake.reply)} characters kept]")
    assert result.attempts[0].raw_response == raw
    assert reply_problem(make_request(), result, Rules()) is None  # a remote worker's excerpt passes the pool


_PEAK_RSS = """import resource, sys
from sim.cli import main
code = main(sys.argv[1:])
print("peak-rss-kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


async def _run_against(fake: FakeOpenAI, broker: str, db: Path) -> int:
    """`npcsim run` of the village on the fake server, in a child process; its peak RSS in KiB."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PEAK_RSS, "run", str(REPO / "scenarios" / "village.toml"), "--broker", broker,
        "--run-id", db.stem, "--ticks", "12", "--db", str(db), "--backend", "openai", "--base-url", fake.base_url,
        "--quiet", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await child.communicate()
    assert child.returncode == 0, err.decode()
    return int(out.decode().split("peak-rss-kb")[-1])


@pytest.mark.mosquitto
@pytest.mark.slow
async def test_a_run_answered_50_mb_costs_bounded_memory_and_store(
    fake: FakeOpenAI, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """The issue's run: 50 MB per inference; the run's peak RSS and its store stay near a normal run's."""
    normal = await _run_against(fake, mosquitto.url, tmp_path / "normal.db")
    answered = len(fake.requests)
    fake.default = "huge"
    huge = await _run_against(fake, mosquitto.url, tmp_path / "huge.db")
    assert answered > 0 and len(fake.requests) >= 2 * answered  # the huge run asked as often
    growth_kb = huge - normal
    assert growth_kb < 20 * 1024, f"peak RSS {huge} KiB against {normal} KiB (the replies are 50 MB each)"
    with open_reader(tmp_path / "huge.db") as reader:
        records = list(reader.audit_records())
    assert records and all(r.fallback_reason == "backend_error" and r.attempts[-1].raw_response is None
                           for r in records)
    sizes = {name: _store_size(tmp_path, name) for name in ("normal", "huge")}
    assert sizes["huge"] < sizes["normal"] + 256 * 1024, sizes


def _store_size(directory: Path, name: str) -> int:
    """Bytes of a store with its WAL and shared-memory files."""
    return sum(p.stat().st_size for p in directory.glob(f"{name}.db*"))
