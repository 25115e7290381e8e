"""`npcsim loadtest` round trips through the real inference pool, in-process and over Mosquitto."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.loadtest import LoadTestConfig, run_loadtest
from tests.broken_builders import drop_first_fact


async def test_round_trip_in_process_alongside_the_sweep() -> None:
    result = await run_loadtest(
        LoadTestConfig(agents=300, requests=400, duration_s=None, concurrency=16, processes=1, latency_ms=1)
    )
    assert result.violations == 0
    assert result.inferences == result.round_trip_latency.count == 400
    assert result.snapshots == result.sweep_snapshots + 400
    assert result.fallbacks == 0
    assert result.inferences_per_s > 0
    rt, infer = result.round_trip_latency, result.infer_latency
    assert 0 < infer.p50_ms <= rt.p50_ms and rt.p99_ms <= rt.max_ms


async def test_broken_builder_in_the_round_trip_is_caught() -> None:
    result = await run_loadtest(
        LoadTestConfig(agents=100, requests=200, duration_s=None, concurrency=8, processes=0),
        builder=drop_first_fact,
    )
    assert result.violations > 0
    assert result.first_violations[0].source == "round_trip"
    assert result.build_latency.count == 200  # without a sweep, the round trip's builds are the build figures


@pytest.mark.mosquitto
def test_end_to_end_over_mosquitto(mosquitto: object, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    url = mosquitto.url  # type: ignore[attr-defined]
    code = main(["loadtest", "--agents", "200", "--requests", "300", "--concurrency", "8", "--processes", "0",
                 "--broker", url, "--json", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())
    assert figures["broker"] == url
    assert figures["inferences"] == 300 and figures["violations"] == 0


def test_latency_with_another_backend_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["loadtest", "--requests", "5", "--backend", "openai", "--latency-ms", "5", "--processes", "0"])
    assert code == 2
    assert "--latency-ms" in capsys.readouterr().err
