"""What `npcsim loadtest` shows: the live progress line (rich), and the result as sections
of rows that the command line prints as tables on a terminal and as plain lines in a pipe."""

from __future__ import annotations

from typing import NamedTuple

from rich.text import Text

from sim.loadtest._stats import KNEE_GAIN, GateFigures, LatencyFigures, LimitFigures, LoadTestResult, Progress
from sim.loadtest._truncation import CATEGORIES, CategoryTruncation, TruncationFigures

__all__ = ["Cell", "Section", "progress_view", "result_sections"]

Cell = str | tuple[str, str]
"""A cell of a row: text, or (text, rich style) for a terminal."""


class Section(NamedTuple):
    """One table of the result: its columns and rows, the columns aligned right, a caption,
    and the lines that follow it (the knee of a sweep)."""

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[Cell, ...]]
    right: tuple[str, ...] = ()
    caption: str | None = None
    notes: tuple[str, ...] = ()


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


def result_sections(r: LoadTestResult) -> list[Section]:
    """The figures of a finished run, table by table: figures, latency, truncation, then the
    sweep (with more than one concurrency) and the first violations (when there are any)."""
    sections = [_figures_section(r), _latency_section(r), _truncation_section(r)]
    if len({p.concurrency for p in r.sweep}) > 1:
        sections.append(_sweep_section(r))
    if r.violations:
        sections.append(_violations_section(r))
    if r.gates is not None:
        sections += _gate_sections(r.gates)
    return sections


def _latency_row(name: str, f: LatencyFigures) -> tuple[Cell, ...]:
    if f.count:
        return name, f"{f.p50_ms:.3f}", f"{f.p95_ms:.3f}", f"{f.p99_ms:.3f}", f"{f.max_ms:.3f}", f"{f.count:,}"
    return name, "-", "-", "-", "-", "0"


def _figures_section(r: LoadTestResult) -> Section:
    """The run's throughput and counts."""
    budget = ", ".join(_budget_name(b.max_context_chars, b.max_context_tokens) for b in r.budgets)
    levels = sorted({p.concurrency for p in r.sweep}) or [r.concurrency]
    via = f"MQTT {r.broker}" if r.broker else "in-process"
    processes = f"{r.processes} sweep process" + ("" if r.processes == 1 else "es")
    rows: list[tuple[Cell, ...]] = [
        ("agents", f"{r.agents:,}"),
        ("budgets", budget),
        ("duration (s)", f"{r.duration_s:.1f}"),
        (f"snapshots/s, build+check ({processes})", f"{r.snapshots_per_s:,.0f}"),
        ("snapshots/s, all (sweep + round trip)", f"{r.all_snapshots_per_s:,.0f}"),
        ("snapshots built and checked", f"{r.snapshots:,}"),
        (f"inferences/s ({via}, {r.backend}, {r.latency_ms:g} ms, concurrency {','.join(map(str, levels))})",
         f"{r.inferences_per_s:,.0f}"),
        ("inferences", f"{r.inferences:,}"),
        ("invariant violations", (str(r.violations), "bold red" if r.violations else "bold green")),
        ("over-budget snapshots (legitimate)", f"{r.over_budget:,}"),
        ("fallbacks", f"{r.fallbacks:,}"),
        ("peak RSS, with children", f"{r.peak_rss_mb:,.0f} MB"),
    ]
    rows += [(f"in flight at most: {server}", _limit(f)) for server, f in sorted(r.server_limits.items())]
    return Section("npcsim loadtest", ("figure", "value"), rows, right=("value",))


def _limit(f: LimitFigures) -> str:
    """A server's adaptive limit: the value it settled on, then the range it moved in."""
    return f"{f.final} ({f.min}-{f.max})"


def _latency_section(r: LoadTestResult) -> Section:
    """The latencies of the parts of a round trip, in milliseconds."""
    rows = [
        _latency_row("build", r.build_latency),
        _latency_row("check", r.check_latency),
        _latency_row("inference", r.infer_latency),
        _latency_row("round trip (build+check+inference)", r.round_trip_latency),
    ]
    columns = ("latency (ms)", "p50", "p95", "p99", "max", "samples")
    return Section("latency (ms)", columns, rows, right=columns[1:])


def _budget_name(chars: int, tokens: int | None) -> str:
    return f"{chars:,} ch" + (f"/{tokens:,} tok" if tokens else "")


def _selection(figures: TruncationFigures) -> str:
    """The selection that built the snapshots (each one's count if more than one did)."""
    used = [(name, n) for name, n in figures.selections.items() if n]
    return used[0][0] if len(used) == 1 else " + ".join(f"{name} {n:,}" for name, n in used) or "none built"


def _truncation_section(r: LoadTestResult) -> Section:
    """Per category, budget and selection: how often it was cut, items kept/dropped/duplicate,
    how full its budget was."""
    named: list[tuple[str, TruncationFigures]] = [
        (f"{_budget_name(b.max_context_chars, b.max_context_tokens)}, {_selection(b.truncation)}", b.truncation)
        for b in r.budgets
    ]
    rows: list[tuple[Cell, ...]] = []
    for category in CATEGORIES:
        for name, figures in named:
            c: CategoryTruncation = getattr(figures, category)
            rows.append((category, name, f"{c.cut_fraction:.0%}", f"{c.kept_mean:.1f}", f"{c.dropped_mean:.1f}",
                         f"{c.duplicate_mean:.1f}", f"{c.used_fraction_mean:.0%}"))
    for name, figures in named:
        rows.append(("over budget", name, f"{figures.over_budget_fraction:.1%}", "", "", "", ""))
    return Section("truncation per category", ("category", "budget", "cut", "kept", "dropped", "duplicate", "used"),
                   rows, right=("cut", "kept", "dropped", "duplicate", "used"),
                   caption="cut: share of snapshots that lost an item; "
                   "duplicate: memories a kept line says already; "
                   "used: mean share of the category's budget (mandatory: of the limit)")


def _sweep_section(r: LoadTestResult) -> Section:
    """The saturation curve per budget, and the knee: where more concurrency stops paying."""

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    rows: list[tuple[Cell, ...]] = []
    for p in r.sweep:
        f = p.latency
        rows.append((
            _budget_name(p.max_context_chars, p.max_context_tokens), str(p.concurrency), f"{p.inferences_per_s:,.1f}",
            f"{f.p50_ms:.1f}/{f.p95_ms:.1f}/{f.p99_ms:.1f}", f"{p.fallbacks:,}",
            f"{rate(p.prompt_tokens_per_s)}/{rate(p.completion_tokens_per_s)}",
            "-" if p.prompt_cache_share is None else f"{p.prompt_cache_share:.0%}",
            "; ".join(_limit(f) for _, f in sorted(p.server_limits.items())) or "-",
        ))
    notes = []
    for b in r.budgets:
        name = _budget_name(b.max_context_chars, b.max_context_tokens)
        if b.knee_concurrency is None:
            notes.append(f"{name}: no knee: beyond each level a higher one gave {KNEE_GAIN:.0%} more inferences/s")
        else:
            notes.append(f"{name}: knee at concurrency {b.knee_concurrency}: beyond it, "
                         f"inferences/s rose by less than {KNEE_GAIN:.0%}")
    columns = ("budget", "conc.", "inferences/s", "p50/p95/p99 ms", "fallbacks", "tokens/s in/out", "cached",
               "limit")
    return Section("model-server sweep (inference latency: pool queue + backend)", columns, rows,
                   right=columns[1:], notes=tuple(notes),
                   caption="limit: each server's adaptive limit on requests in flight, settled (lowest-highest)")


def _violations_section(r: LoadTestResult) -> Section:
    """The first violations found, with the agent and the input that broke it."""
    rows: list[tuple[Cell, ...]] = [(v.agent_id, v.invariant, v.source, v.detail) for v in r.first_violations]
    return Section(f"first {len(r.first_violations)} of {r.violations} violations",
                   ("agent", "invariant", "where", "detail"), rows)


def _gate_sections(g: GateFigures) -> list[Section]:
    """`--output structured`: the gates' verdicts by code, and the rules an accepted part broke."""
    total = sum(g.verdicts.values())
    rows: list[tuple[Cell, ...]] = [(code, f"{n:,}", f"{n / total:.1%}") for code, n in g.verdicts.items()]
    rows += [
        ("proposals (beliefs, memories, intents)", f"{g.proposals:,}", f"{g.proposals_per_s:,.1f}/s"),
        ("gate violations", (str(g.violations), "bold red" if g.violations else "bold green"), ""),
    ]
    sections = [Section("gate verdicts (every part of every attempt)", ("code", "count", "share"), rows,
                        right=("count", "share"))]
    if g.violations:
        broken: list[tuple[Cell, ...]] = [(v.agent_id, v.invariant, v.detail) for v in g.first_violations]
        sections.append(Section(f"first {len(g.first_violations)} of {g.violations} gate violations",
                                ("agent", "gate", "detail"), broken))
    return sections
