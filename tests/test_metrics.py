"""Prometheus metrics: scraped from a real endpoint during a run and parsed by prometheus-client."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sim.errors import ConfigError
from sim.inference import PoolStatistics
from sim.loadtest import Progress
from sim.metrics import Metrics, serve_metrics
from sim.shard import BrokerConfig, RunConfig, run
from tests.helpers import REPO, VILLAGE, MosquittoProcess, eventually

EXPECTED = {
    "npcsim_ticks": "counter",
    "npcsim_inferences": "counter",
    "npcsim_fallbacks": "counter",
    "npcsim_retries": "counter",
    "npcsim_over_budget_snapshots": "counter",
    "npcsim_gate_verdicts": "counter",
    "npcsim_prompt_tokens": "counter",
    "npcsim_malformed_messages": "counter",
    "npcsim_reconnects": "counter",
    "npcsim_barrier_resends": "counter",
    "npcsim_barrier_joins_folded": "counter",
    "npcsim_tick_duration_seconds": "histogram",
    "npcsim_inference_latency_seconds": "histogram",
    "npcsim_prompt_chars": "histogram",
    "npcsim_agents": "gauge",
    "npcsim_inferences_in_flight": "gauge",
    "npcsim_inference_queue_depth": "gauge",
    "npcsim_server_limit": "gauge",
    "npcsim_tick": "gauge",
    "npcsim_awaited_shards": "gauge",
}


# family name -> {(sample name, labels): value}
Families = dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]


def scrape(text: str) -> Families:
    """family name -> {(sample name, labels): value}, by prometheus-client's own parser."""
    families: Families = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"family {family.name} appears twice"
        families[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
        if family.name in EXPECTED:
            assert family.type == EXPECTED[family.name], family.name
    return families


def ticks(families: Families) -> float:
    return families.get("npcsim_ticks", {}).get(("npcsim_ticks_total", ()), 0)


def ok(families: Families) -> float:
    return families.get("npcsim_inferences", {}).get(("npcsim_inferences_total", (("outcome", "ok"),)), 0)


@pytest.mark.mosquitto
async def test_metrics_are_scraped_during_a_run(mosquitto: MosquittoProcess) -> None:
    metrics = Metrics()
    stop = asyncio.Event()
    config = RunConfig(scenario=VILLAGE, run_id="m1", ticks=100_000, tick_ms=50, broker=BrokerConfig(url=mosquitto.url))
    with serve_metrics(metrics, 0) as port:
        async with asyncio.TaskGroup() as group:
            job = group.create_task(run(config, stop=stop, metrics=metrics))
            try:
                async with httpx.AsyncClient(timeout=30) as client:

                    async def under_way() -> Families | None:
                        families = scrape((await client.get(f"http://127.0.0.1:{port}/metrics")).text)
                        return families if ticks(families) >= 3 and ok(families) >= 2 else None

                    families = await eventually(under_way, what="3 ticks and 2 answered inferences scraped",
                                                within=90, every=0.2)
            finally:
                stop.set()
            await job
    assert set(EXPECTED) <= set(families)
    assert families["npcsim_agents"][("npcsim_agents", ())] == 4
    assert families["npcsim_tick"][("npcsim_tick", ())] >= 2
    latency = families["npcsim_inference_latency_seconds"]
    assert latency[("npcsim_inference_latency_seconds_count", ())] >= ok(families)
    prompt = families["npcsim_prompt_chars"]
    for category in ("mandatory", "dialogue", "episodic", "beliefs"):
        assert prompt[("npcsim_prompt_chars_count", (("category", category),))] >= 1, category


def test_pool_and_loadtest_sources_are_read_at_scrape_time() -> None:
    metrics = Metrics()
    stats = PoolStatistics(requests=7, completed=6, fallbacks={"timeout": 2}, dropped_stale=1, rejected_outputs=1,
                           in_flight=1, in_flight_peak=3, waiting=4, malformed=5, late_replies=0, retries=1,
                           resent=6)
    metrics.watch_pool(lambda: stats)
    progress = Progress(elapsed_s=1.0, planned_s=2.0, requests=None, snapshots=10, snapshots_per_s=10.0,
                        inferences=0, inferences_per_s=0.0, violations=0, over_budget=0, fallbacks=0, rss_mb=1.0)
    with serve_metrics(metrics, 0) as port:
        families = scrape(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
        assert families["npcsim_inferences"][("npcsim_inferences_total", (("outcome", "ok"),))] == 4
        assert families["npcsim_fallbacks"][("npcsim_fallbacks_total", (("reason", "timeout"),))] == 2
        assert families["npcsim_inference_queue_depth"][("npcsim_inference_queue_depth", ())] == 4
        assert families["npcsim_retries"][("npcsim_retries_total", ())] == 1
        assert families["npcsim_inference_resends"][("npcsim_inference_resends_total", ())] == 6
        key = ("npcsim_malformed_messages_total", (("kind", "inference transport"),))
        assert families["npcsim_malformed_messages"][key] == 5

        loadtest = Metrics()
        loadtest.watch_loadtest(lambda: progress)
        with serve_metrics(loadtest, 0) as second:
            families = scrape(httpx.get(f"http://127.0.0.1:{second}/metrics").text)
        assert families["npcsim_working_memories"][("npcsim_working_memories_total", ())] == 10


def test_a_metrics_port_in_use_is_one_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port {port}"), serve_metrics(Metrics(), port):
            pass


def test_the_grafana_dashboard_and_the_docs_name_only_real_metrics() -> None:
    """The dashboard and docs/operations.md must not drift from what is exported."""
    import re

    exported = {"npcsim_rejected_outputs", "npcsim_stale_requests", "npcsim_inference_resends",
                "npcsim_working_memories", "npcsim_invariant_violations", "npcsim_resident_memory_bytes", *EXPECTED}
    samples = {f"{name}{suffix}" for name in exported for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    for path in (REPO / "docs" / "grafana-dashboard.json", REPO / "docs" / "operations.md"):
        named = set(re.findall(r"npcsim_[a-z_]+", path.read_text()))
        assert named and named <= samples, (path.name, named - samples)


def test_loadtest_serves_metrics_on_its_port(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["loadtest", "--requests", "50", "--concurrency", "4", "--processes", "0",
                 "--metrics-port", str(port)]) == 0
    assert f"metrics: http://127.0.0.1:{port}/metrics" in capsys.readouterr().out
    with pytest.raises(httpx.HTTPError):  # stopped with the command
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
