"""Prometheus metrics for `npcsim run`, `npcsim worker` and `npcsim loadtest` (prefix `npcsim_`).

One `Metrics` object per process, with its own registry (tests open several). What is
already counted elsewhere (the run's counters in sim.shard's RunStats, the bus's and the
pool's) is read at scrape time by collectors, so nothing is counted twice; what only
exists as an event (a tick's duration, an inference's latency, a prompt's size per
category) or a moment (the shards a barrier waits for) is observed as it happens.
`NullMetrics` takes the same calls and keeps nothing: a run nobody scrapes calls it
unconditionally.

    metrics = Metrics()
    with serve_metrics(metrics, port=9100):      # http://127.0.0.1:9100/metrics
        ...

docs/operations.md lists every metric.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sim.errors import ConfigError
from sim.inference import PoolStatistics
from sim.memory import TruncationReport
from sim.protocol.router import BusStats

if TYPE_CHECKING:  # a shard (sim.shard) imports this module; the load test's machinery stays out of it
    from sim.loadtest import Progress

__all__ = ["Metrics", "MetricsSink", "NullMetrics", "RunCounts", "serve_metrics"]

_CHAR_BUCKETS = (50, 100, 200, 400, 800, 1200, 1600, 2000, 3000, 4000, 8000, 16000)
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class RunCounts(Protocol):
    """What a run counts as it goes (sim.shard's RunStats), read at scrape time."""

    agents: int
    first_tick: int
    ticks_done: int
    @property
    def over_budget(self) -> int: ...

    @property
    def verdicts(self) -> dict[str, int]: ...

    @property
    def prompt_tokens_evaluated(self) -> int: ...

    @property
    def prompt_tokens_cached(self) -> int: ...

    @property
    def resends(self) -> int: ...

    @property
    def resends_folded(self) -> int: ...

    @property
    def inferences(self) -> int: ...

    @property
    def npc_moves(self) -> int: ...


class MetricsSink(Protocol):
    """What a shard tells its metrics; `Metrics` keeps it, `NullMetrics` drops it."""

    def watch_run(self, counts: RunCounts) -> None: ...

    def watch_pool(self, statistics: Callable[[], PoolStatistics]) -> None: ...

    def watch_bus(self, stats: BusStats) -> None: ...

    def inference(self, report: TruncationReport, latency_s: float) -> None: ...

    def tick_done(self, duration_s: float) -> None: ...

    def awaiting(self, shards: int) -> None: ...


class NullMetrics:
    """The metrics of a run nobody scrapes: every call taken, nothing kept."""

    def watch_run(self, counts: RunCounts) -> None:
        pass

    def watch_pool(self, statistics: Callable[[], PoolStatistics]) -> None:
        pass

    def watch_bus(self, stats: BusStats) -> None:
        pass

    def inference(self, report: TruncationReport, latency_s: float) -> None:
        pass

    def tick_done(self, duration_s: float) -> None:
        pass

    def awaiting(self, shards: int) -> None:
        pass


class _Sources(Collector):
    """Counters and gauges read at scrape time from the run, the pool, the bus and the loadtest."""

    def __init__(self) -> None:
        self.run: RunCounts | None = None
        self.pool: Callable[[], PoolStatistics] | None = None
        self.bus: BusStats | None = None
        self.loadtest: Callable[[], Progress | None] | None = None

    def collect(self) -> Iterable[Any]:
        if self.run is not None:
            yield from _run_families(self.run)
        if self.pool is not None:
            stats = self.pool()
            inferences = CounterMetricFamily(
                "npcsim_inferences", "Inferences answered, by outcome (ok or fallback).", labels=["outcome"]
            )
            fallback_count = sum(stats.fallbacks.values())
            inferences.add_metric(["ok"], stats.completed - fallback_count)
            inferences.add_metric(["fallback"], fallback_count)
            yield inferences
            fallbacks = CounterMetricFamily("npcsim_fallbacks", "Fallback lines, by reason.", labels=["reason"])
            for reason, count in sorted(stats.fallbacks.items()):
                fallbacks.add_metric([reason], count)
            yield fallbacks
            yield CounterMetricFamily(
                "npcsim_rejected_outputs", "Model outputs rejected by the output checks.", value=stats.rejected_outputs
            )
            yield CounterMetricFamily("npcsim_retries", "Inferences retried after a rejected output.",
                                      value=stats.retries)
            yield CounterMetricFamily("npcsim_stale_requests", "Requests dropped past their deadline.",
                                      value=stats.dropped_stale)
            yield CounterMetricFamily("npcsim_inference_resends",
                                      "Inference requests sent to the workers again (a broker outage, a dead worker).",
                                      value=stats.resent)
            yield GaugeMetricFamily("npcsim_inferences_in_flight", "Inferences being served now.",
                                    value=stats.in_flight)
            yield GaugeMetricFamily("npcsim_inference_queue_depth", "Inferences waiting for a slot.",
                                    value=stats.waiting)
            limits = GaugeMetricFamily("npcsim_server_limit", "Each model server's adaptive limit on inferences "
                                       "in flight.", labels=["server"])
            for server, limit in sorted(stats.server_limits.items()):
                limits.add_metric([server], limit)
            yield limits
        malformed = CounterMetricFamily(
            "npcsim_malformed_messages", "Refused or malformed messages, dropped, by kind.", labels=["kind"]
        )
        if self.bus is not None:
            for kind, count in sorted(self.bus.malformed.items()):
                malformed.add_metric([kind], count)
            for kind, count in sorted(self.bus.refusals.counts.items()):
                malformed.add_metric([f"refused {kind}"], count)
        if self.pool is not None:
            malformed.add_metric(["inference transport"], self.pool().malformed)
        yield malformed
        if self.bus is not None:
            yield CounterMetricFamily("npcsim_reconnects", "MQTT reconnections.", value=self.bus.reconnects)
        progress = self.loadtest() if self.loadtest is not None else None
        if progress is not None:
            yield from _loadtest_families(progress)


def _run_families(run: RunCounts) -> Iterator[Any]:
    yield CounterMetricFamily("npcsim_ticks", "Ticks completed.", value=run.ticks_done)
    yield CounterMetricFamily("npcsim_over_budget_snapshots",
                              "Working memories whose mandatory part exceeded the limit.", value=run.over_budget)
    yield CounterMetricFamily("npcsim_barrier_resends", "Re-sends of kept barrier messages made for peers' Joins.",
                              value=run.resends)
    yield CounterMetricFamily("npcsim_barrier_joins_folded",
                              "Peers' Joins folded into a later re-send (at most one per peer per second).",
                              value=run.resends_folded)
    verdicts = CounterMetricFamily("npcsim_gate_verdicts", "The gates' verdicts on structured replies but ok, by code.",
                                   labels=["code"])
    for code, count in sorted(run.verdicts.items()):
        verdicts.add_metric([code], count)
    yield verdicts
    prompt_tokens = CounterMetricFamily(
        "npcsim_prompt_tokens", "Prompt tokens the model server evaluated or reused from its cache, as it said.",
        labels=["state"],
    )
    prompt_tokens.add_metric(["evaluated"], run.prompt_tokens_evaluated)
    prompt_tokens.add_metric(["cached"], run.prompt_tokens_cached)
    yield prompt_tokens
    yield GaugeMetricFamily("npcsim_agents", "Agents in this process.", value=run.agents)
    yield CounterMetricFamily("npcsim_npc_ticks", "NPC-ticks stepped (agents times ticks): inferences over "
                              "this is what a tick of one NPC costs.", value=run.agents * run.ticks_done)
    yield CounterMetricFamily("npcsim_npc_moves", "This process's NPCs' moves (routines, go_to, the game's); "
                              "none costs an inference.", value=run.npc_moves)
    last = run.first_tick + run.ticks_done - 1 if run.ticks_done else 0
    yield GaugeMetricFamily("npcsim_tick", "The last tick completed.", value=last)


def _loadtest_families(progress: Progress) -> Iterator[Any]:
    """A load test counts in its worker processes; its progress report is what this process knows."""
    inferences = CounterMetricFamily("npcsim_inferences", "Inferences answered, by outcome.", labels=["outcome"])
    inferences.add_metric(["ok"], progress.inferences - progress.fallbacks)
    inferences.add_metric(["fallback"], progress.fallbacks)
    yield inferences
    fallbacks = CounterMetricFamily("npcsim_fallbacks", "Fallback lines, by reason.", labels=["reason"])
    fallbacks.add_metric(["any"], progress.fallbacks)
    yield fallbacks
    yield CounterMetricFamily("npcsim_working_memories", "Working memories built.", value=progress.snapshots)
    yield CounterMetricFamily("npcsim_over_budget_snapshots",
                              "Working memories whose mandatory part exceeded the limit.", value=progress.over_budget)
    yield CounterMetricFamily("npcsim_invariant_violations", "Working-memory invariant violations (must be 0).",
                              value=progress.violations)
    yield GaugeMetricFamily("npcsim_resident_memory_bytes", "Resident memory of the load test.",
                            value=progress.rss_mb * 1024 * 1024)


class Metrics:
    """The process's metrics; a shard, a worker and the load test feed it (a `MetricsSink`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._sources = _Sources()
        r.register(self._sources)
        self.tick_duration = Histogram(
            "npcsim_tick_duration_seconds", "Wall time of a tick's work.", buckets=_TICK_BUCKETS, registry=r
        )
        self.inference_latency = Histogram(
            "npcsim_inference_latency_seconds", "Time from asking the pool to the answer.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.prompt_chars = Histogram(
            "npcsim_prompt_chars", "Characters of a prompt, by category.", ["category"],
            buckets=_CHAR_BUCKETS, registry=r,
        )
        self.awaited_shards = Gauge(
            "npcsim_awaited_shards", "Shards whose batches this shard waits for before the next tick.", registry=r
        )

    def watch_run(self, counts: RunCounts) -> None:
        """Ticks, agents, over-budget prompts and barrier re-sends, as the run counts them."""
        self._sources.run = counts

    def watch_pool(self, statistics: Callable[[], PoolStatistics]) -> None:
        self._sources.pool = statistics

    def watch_bus(self, stats: BusStats) -> None:
        """Malformed and refused messages by kind, and reconnects, as the shard's bus counts them."""
        self._sources.bus = stats

    def watch_loadtest(self, progress: Callable[[], Progress | None]) -> None:
        """A load test has no pool here: its progress reports stand for the counters."""
        self._sources.loadtest = progress

    def inference(self, report: TruncationReport, latency_s: float) -> None:
        """Observe one finished inference: its latency and how its prompt was filled."""
        self.inference_latency.observe(latency_s)
        self.prompt_chars.labels("mandatory").observe(report.mandatory_chars)
        self.prompt_chars.labels("dialogue").observe(report.dialogue.used)
        self.prompt_chars.labels("episodic").observe(report.episodic.used)
        self.prompt_chars.labels("beliefs").observe(report.beliefs.used)

    def tick_done(self, duration_s: float) -> None:
        self.tick_duration.observe(duration_s)

    def awaiting(self, shards: int) -> None:
        """How many shards the barrier waits for now (0 once it passed)."""
        self.awaited_shards.set(shards)


@contextlib.contextmanager
def serve_metrics(metrics: Metrics, port: int, host: str = "127.0.0.1") -> Iterator[int]:
    """Serve `/metrics` on host:port (0: a free port) in a thread; yields the port, stops on exit."""
    try:
        server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        raise ConfigError(f"--metrics-port {port}: cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
