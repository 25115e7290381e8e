"""The live progress line and the final table of `npcsim loadtest` (rich)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from sim.loadtest._stats import KNEE_GAIN, LatencyFigures, LoadTestResult, Progress
from sim.loadtest._truncation import CATEGORIES, CategoryTruncation, TruncationFigures

__all__ = ["final_table", "print_result", "progress_view", "sweep_table", "truncation_table", "violations_table"]


def progress_view(p: Progress) -> Text:
    """One line: how far the run is and the figures that must stay at zero."""
    if p.planned_s is not None:
        where = f"{p.elapsed_s:5.1f}/{p.planned_s:.0f} s"
    else:
        where = f"{p.elapsed_s:5.1f} s, {p.inferences}/{p.requests} requests"
    style = "bold red" if p.violations else "green"
    return Text.assemble(
        (f"loadtest {where}  ", "bold"),
        f"{p.phase}  " if p.phase else "",
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
    budget = ", ".join(_budget_name(b.max_context_chars, b.max_context_tokens) for b in r.budgets)
    levels = sorted({p.concurrency for p in r.sweep}) or [r.concurrency]
    via = f"MQTT {r.broker}" if r.broker else "in-process"
    figures = Table(title=f"npcsim loadtest: {r.agents:,} agents, {budget}, {r.duration_s:.1f} s", show_edge=False)
    figures.add_column("figure")
    figures.add_column("value", justify="right")
    processes = f"{r.processes} sweep process" + ("" if r.processes == 1 else "es")
    figures.add_row(f"snapshots/s, build+check ({processes})", f"{r.snapshots_per_s:,.0f}")
    figures.add_row("snapshots/s, all (sweep + round trip)", f"{r.all_snapshots_per_s:,.0f}")
    figures.add_row("snapshots built and checked", f"{r.snapshots:,}")
    figures.add_row(
        f"inferences/s ({via}, {r.backend}, {r.latency_ms:g} ms, concurrency {','.join(map(str, levels))})",
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


def _budget_name(chars: int, tokens: int | None) -> str:
    return f"{chars:,} ch" + (f"/{tokens:,} tok" if tokens else "")


def _selection(figures: TruncationFigures) -> str:
    """The selection that built the snapshots (each one's count if more than one did)."""
    used = [(name, n) for name, n in figures.selections.items() if n]
    return used[0][0] if len(used) == 1 else " + ".join(f"{name} {n:,}" for name, n in used) or "none built"


def truncation_table(r: LoadTestResult) -> Table:
    """Per category and budget: how often it was cut, items kept/dropped, how full its budget was."""
    table = Table(title="truncation per category", caption="cut: share of snapshots that lost an item; "
                  "used: mean share of the category's budget (mandatory: of the limit)", show_edge=False)
    for column in ("category", "budget", "cut", "kept", "dropped", "used"):
        table.add_column(column, justify="left" if column in ("category", "budget") else "right")
    named: list[tuple[str, TruncationFigures]] = [
        (f"{_budget_name(b.max_context_chars, b.max_context_tokens)}, {_selection(b.truncation)}", b.truncation)
        for b in r.budgets
    ]
    for category in CATEGORIES:
        for j, (name, figures) in enumerate(named):
            c: CategoryTruncation = getattr(figures, category)
            table.add_row(
                category if j == 0 else "", name, f"{c.cut_fraction:.0%}", f"{c.kept_mean:.1f}",
                f"{c.dropped_mean:.1f}", f"{c.used_fraction_mean:.0%}", end_section=j == len(named) - 1,
            )
    for j, (name, figures) in enumerate(named):
        table.add_row("over budget" if j == 0 else "", name, f"{figures.over_budget_fraction:.1%}", "", "", "")
    return table


def sweep_table(r: LoadTestResult) -> Group:
    """The saturation curve per budget, and the knee: where more concurrency stops paying."""
    table = Table(title="model-server sweep (inference latency: pool queue + backend)", show_edge=False)
    for column in ("budget", "conc.", "inferences/s", "p50/p95/p99 ms", "fallbacks", "tokens/s in/out"):
        table.add_column(column, justify="left" if column == "budget" else "right", no_wrap=column == "budget")

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    for p in r.sweep:
        f = p.latency
        table.add_row(
            _budget_name(p.max_context_chars, p.max_context_tokens), str(p.concurrency), f"{p.inferences_per_s:,.1f}",
            f"{f.p50_ms:.1f}/{f.p95_ms:.1f}/{f.p99_ms:.1f}", f"{p.fallbacks:,}",
            f"{rate(p.prompt_tokens_per_s)}/{rate(p.completion_tokens_per_s)}",
        )
    lines = []
    for b in r.budgets:
        name = _budget_name(b.max_context_chars, b.max_context_tokens)
        if b.knee_concurrency is None:
            lines.append(f"{name}: no knee: beyond each level a higher one gave {KNEE_GAIN:.0%} more inferences/s")
        else:
            lines.append(f"{name}: knee at concurrency {b.knee_concurrency}: beyond it, "
                         f"inferences/s rose by less than {KNEE_GAIN:.0%}")
    return Group(table, Text("\n".join(lines), style="bold"))


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
    console.print()
    console.print(truncation_table(r))
    if len({p.concurrency for p in r.sweep}) > 1:
        console.print()
        console.print(sweep_table(r))
    if r.violations:
        console.print()
        console.print(violations_table(r))
