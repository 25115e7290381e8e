"""The live progress line and the final table of `npcsim loadtest` (rich)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from sim.loadtest._run import Progress
from sim.loadtest._stats import LatencyFigures, LoadTestResult

__all__ = ["final_table", "print_result", "progress_view", "violations_table"]


def progress_view(p: Progress) -> Text:
    """One line: how far the run is and the figures that must stay at zero."""
    if p.planned_s is not None:
        where = f"{p.elapsed_s:5.1f}/{p.planned_s:.0f} s"
    else:
        where = f"{p.elapsed_s:5.1f} s, {p.inferences}/{p.requests} requests"
    style = "bold red" if p.violations else "green"
    return Text.assemble(
        (f"loadtest {where}  ", "bold"),
        f"snapshots {p.snapshots:,} ({p.snapshots_per_s:,.0f}/s)  ",
        f"inferences {p.inferences:,} ({p.inferences_per_s:,.0f}/s)  ",
        (f"violations {p.violations}", style),
        f"  over budget {p.over_budget:,}  fallbacks {p.fallbacks:,}  RSS {p.rss_mb:,.0f} MB",
    )


def _latency_row(table: Table, name: str, f: LatencyFigures) -> None:
    if f.count:
        table.add_row(name, f"{f.p50_ms:.3f}", f"{f.p95_ms:.3f}", f"{f.p99_ms:.3f}", f"{f.max_ms:.3f}", f"{f.count:,}")
    else:
        table.add_row(name, "-", "-", "-", "-", "0")


def final_table(r: LoadTestResult) -> Group:
    """The figures of a finished run: throughput and counts, then latencies."""
    budget = f"{r.max_context_chars} chars" + (f", {r.max_context_tokens} tokens" if r.max_context_tokens else "")
    via = f"MQTT {r.broker}" if r.broker else "in-process"
    figures = Table(title=f"npcsim loadtest: {r.agents:,} agents, {budget}, {r.duration_s:.1f} s", show_edge=False)
    figures.add_column("figure")
    figures.add_column("value", justify="right")
    figures.add_row(f"snapshots/s, build+check ({r.processes} sweep processes)", f"{r.snapshots_per_s:,.0f}")
    figures.add_row("snapshots/s, all (sweep + round trip)", f"{r.all_snapshots_per_s:,.0f}")
    figures.add_row("snapshots built and checked", f"{r.snapshots:,}")
    figures.add_row(
        f"inferences/s ({via}, {r.backend}, {r.latency_ms:g} ms, concurrency {r.concurrency})",
        f"{r.inferences_per_s:,.0f}",
    )
    figures.add_row("inferences", f"{r.inferences:,}")
    figures.add_row(
        "invariant violations", Text(str(r.violations), style="bold red" if r.violations else "bold green")
    )
    figures.add_row("over-budget snapshots (legitimate)", f"{r.over_budget:,}")
    figures.add_row("fallbacks", f"{r.fallbacks:,}")
    figures.add_row("peak RSS, with children", f"{r.peak_rss_mb:,.0f} MB")
    latency = Table(title="latency (ms)", show_edge=False)
    for column in ("", "p50", "p95", "p99", "max", "samples"):
        latency.add_column(column, justify="left" if not column else "right")
    _latency_row(latency, "build", r.build_latency)
    _latency_row(latency, "check", r.check_latency)
    _latency_row(latency, "inference", r.infer_latency)
    _latency_row(latency, "round trip (build+check+inference)", r.round_trip_latency)
    return Group(figures, Text(), latency)


def violations_table(r: LoadTestResult) -> Table:
    """The first violations found, with the agent and the input that broke it."""
    table = Table(title=f"first {len(r.first_violations)} of {r.violations} violations", show_edge=False)
    for column in ("agent", "invariant", "where", "detail"):
        table.add_column(column)
    for v in r.first_violations:
        table.add_row(v.agent_id, v.invariant, v.source, v.detail)
    return table


def print_result(console: Console, r: LoadTestResult) -> None:
    console.print(final_table(r))
    if r.violations:
        console.print()
        console.print(violations_table(r))
