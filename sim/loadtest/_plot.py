"""`--plot`: what the run did over time, what each budget cut, and the saturation curve (extra `plot`).

Rows: throughput over time, latency over time (phases marked), truncation per category
for each budget (share of snapshots cut; share of the category's budget used), and, when
`--concurrency` was a list, inferences/s and latency against concurrency with the knee.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.errors import ConfigError
from sim.loadtest._stats import LoadTestResult, TimelinePoint
from sim.loadtest._truncation import CATEGORIES

__all__ = ["require_matplotlib", "write_plot"]


def require_matplotlib() -> None:
    """Refuse `--plot` before the run, not after it, when the extra is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib, the 'plot' extra: pip install 'npcsim[plot]'") from exc


def _phase_starts(timeline: list[TimelinePoint]) -> list[tuple[float, str]]:
    """Where each phase's points begin on the time axis, with its label."""
    starts: list[tuple[float, str]] = []
    previous: tuple[int, int] | None = None
    for point in timeline:
        key = (point.max_context_chars, point.concurrency)
        if key != previous:
            starts.append((point.t_s - 1.0, f"{key[0]} ch" + (f", c={key[1]}" if key[1] else "")))
            previous = key
    return starts


def _broken(timeline: list[TimelinePoint], field: str) -> tuple[list[float], list[float]]:
    """Times and values with a gap (NaN) between phases, so no line crosses the pause between them."""
    t: list[float] = []
    values: list[float] = []
    previous: tuple[int, int] | None = None
    for point in timeline:
        key = (point.max_context_chars, point.concurrency)
        if previous is not None and key != previous:
            t.append(point.t_s)
            values.append(float("nan"))
        t.append(point.t_s)
        values.append(getattr(point, field))
        previous = key
    return t, values


def _mark_phases(axes: Any, starts: list[tuple[float, str]], label: bool) -> None:
    if len(starts) < 2:
        return
    for t, name in starts:
        axes.axvline(t, color="grey", linewidth=0.8, linestyle=":")
        if label:
            axes.annotate(name, (t, 1.0), xycoords=("data", "axes fraction"), fontsize=7, rotation=90,
                          va="top", ha="right", color="dimgrey")


def _bars(axes: Any, result: LoadTestResult, field: str, title: str) -> None:
    """One group of bars per category, one bar per budget."""
    n = len(result.budgets)
    width = 0.8 / n
    for j, budget in enumerate(result.budgets):
        values = [getattr(getattr(budget.truncation, c), field) * 100 for c in CATEGORIES]
        name = f"{budget.max_context_chars} chars" + (
            f" / {budget.max_context_tokens} tok" if budget.max_context_tokens else ""
        )
        axes.bar([i + (j - (n - 1) / 2) * width for i in range(len(CATEGORIES))], values, width, label=name)
    axes.set_xticks(range(len(CATEGORIES)), list(CATEGORIES))
    axes.set_ylabel("%")
    axes.set_title(title, fontsize=10)
    axes.legend(loc="best", fontsize=8)


def _sweep(rates: Any, latency: Any, result: LoadTestResult) -> None:
    for budget in result.budgets:
        points = [p for p in result.sweep if p.max_context_chars == budget.max_context_chars
                  and p.max_context_tokens == budget.max_context_tokens]
        points.sort(key=lambda p: p.concurrency)
        levels = [p.concurrency for p in points]
        line = rates.plot(levels, [p.inferences_per_s for p in points], marker="o",
                          label=f"{budget.max_context_chars} chars")[0]
        if budget.knee_concurrency is not None:
            knee = next(p for p in points if p.concurrency == budget.knee_concurrency)
            rates.annotate(f"knee: {knee.concurrency}", (knee.concurrency, knee.inferences_per_s),
                           textcoords="offset points", xytext=(5, -12), fontsize=8, color=line.get_color())
        latency.plot(levels, [p.latency.p50_ms for p in points], marker="o", color=line.get_color(),
                     label=f"p50, {budget.max_context_chars} chars")
        latency.plot(levels, [p.latency.p95_ms for p in points], marker="^", linestyle="--",
                     color=line.get_color(), label=f"p95, {budget.max_context_chars} chars")
    levels = sorted({p.concurrency for p in result.sweep})
    for axes, ylabel, title in ((rates, "inferences/s", "saturation curve"),
                                (latency, "ms", "inference latency")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(levels, [str(c) for c in levels])
        axes.minorticks_off()
        axes.set_xlabel("concurrency")
        axes.set_ylabel(ylabel)
        axes.set_title(title, fontsize=10)
        axes.legend(loc="best", fontsize=8)


def write_plot(result: LoadTestResult, path: Path) -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # no display: write a file only
    import matplotlib.pyplot as plt

    swept = len({p.concurrency for p in result.sweep}) > 1
    rows = 4 if swept else 3
    fig = plt.figure(figsize=(11, 3.2 * rows))
    try:
        grid = fig.add_gridspec(rows, 2)
        rates = fig.add_subplot(grid[0, :])
        latency = fig.add_subplot(grid[1, :], sharex=rates)
        timeline = result.timeline
        starts = _phase_starts(timeline)
        rates.plot(*_broken(timeline, "snapshots_per_s"), marker=".", label="snapshots/s (all)")
        rates.set_ylabel("snapshots/s")
        rates.set_ylim(bottom=0)
        inferences = rates.twinx()  # a different scale: an inference costs far more than a snapshot
        inferences.plot(*_broken(timeline, "inferences_per_s"), marker=".", color="tab:orange", label="inferences/s")
        inferences.set_ylabel("inferences/s")
        inferences.set_ylim(bottom=0)
        rates.legend(handles=rates.get_lines() + inferences.get_lines(), loc="lower right", fontsize=8)
        rates.set_title(f"npcsim loadtest: {result.agents:,} agents, {result.snapshots:,} snapshots checked, "
                        f"violations {result.violations}")
        _mark_phases(rates, starts, label=True)
        latency.plot(*_broken(timeline, "build_p50_ms"), marker=".", label="build p50")
        latency.plot(*_broken(timeline, "round_trip_p50_ms"), marker=".", label="round trip p50")
        latency.set_ylabel("ms")
        latency.set_xlabel("seconds into the run")
        latency.legend(loc="upper right", fontsize=8)
        _mark_phases(latency, starts, label=False)
        _bars(fig.add_subplot(grid[2, 0]), result, "cut_fraction", "snapshots in which the category lost items")
        _bars(fig.add_subplot(grid[2, 1]), result, "used_fraction_mean",
              "share of the category's budget used (mandatory: of the limit)")
        if swept:
            _sweep(fig.add_subplot(grid[3, 0]), fig.add_subplot(grid[3, 1]), result)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
