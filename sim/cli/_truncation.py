"""Truncation as the CLI shows it: the report's table, then what was dropped (and a JSON list).

`audit show`, `memory show` and `audit export` use these; the explanation itself is
`sim.memory.explain_truncation` (derived from the snapshot, never stored). Printing goes
through `sim.cli._terminal.Out`: rich tables on a terminal; in a pipe, tab-separated lines
under a header line, with the title and the caption on lines of their own, and every text
of the run (a dropped item's) escaped.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sim.cli._terminal import Out
from sim.memory import TruncationExplanation, TruncationReport

__all__ = ["dropped_json", "print_truncation", "report_json"]

_CATEGORIES = ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs")
_REPORT_COLUMNS = ("category", "split", "after redistribution", "used", "kept", "dropped", "reason")
_DROPPED_COLUMNS = ("category", "tick", "reason", "text")
_REASONS = {
    "cap": "the count cap was reached",
    "budget": "did not fit what was left",
    "over_budget": "mandatory content took the whole limit",
    "duplicate": "a kept line of the dialogue says it",
    "stable_prefix": "kept, but the stable prefix starts at a later anchor",
}


def _report_rows(explanation: TruncationExplanation) -> list[tuple[str, ...]]:
    """One row per category: its budget as split and after redistribution, what it used, kept and dropped.

    Canonical facts and world state are mandatory (always included): they take what they
    need, from the limit, before the split. The reason is truncation's, then `duplicate`
    when memories were left out because the dialogue says them.
    """
    rows: list[tuple[str, ...]] = []
    for name in _CATEGORIES:
        row = getattr(explanation, name)
        delta = row.final - row.split
        after = "" if row.mandatory else f"{row.final} ({delta:+d})" if delta else str(row.final)
        reasons = ", ".join(r for r in (row.reason, "duplicate" if row.duplicate else None) if r)
        rows.append((name, "mandatory" if row.mandatory else str(row.split), after, str(row.used), str(row.kept),
                     str(len(row.dropped)), reasons))
    return rows


def _report_caption(report: TruncationReport, explanation: TruncationExplanation) -> str:
    tokens = f", {report.prompt_tokens}/{report.limit_tokens} tokens" if report.limit_tokens else ""
    flag = " OVER BUDGET" if report.over_budget else ""
    stable = f" (stable prefix gave up {report.stable_cost_chars})" if report.stable_cost_chars else ""
    return (
        f"{report.selection} selection, limit {report.limit_chars} chars: prompt {report.prompt_chars}{tokens}; "
        f"mandatory {report.mandatory_chars}, split between the others {max(explanation.flexible_chars, 0)}, "
        f"left unused {explanation.unused_chars}{stable}{flag}"
    )


def print_truncation(out: Out, report: TruncationReport, explanation: TruncationExplanation) -> None:
    """The report's table (its caption, naming the selection, on a line of its own in a pipe), then
    every dropped item, in each category's order (newest, or best ranked, first), and what the
    reasons mean."""
    caption = _report_caption(report, explanation)
    out.table(_REPORT_COLUMNS, _report_rows(explanation), caption=caption,
              right=("split", "after redistribution", "used", "kept", "dropped"), header=True)
    if not out.terminal:
        out.record(caption)
    dropped = explanation.dropped()
    if not dropped:
        out.record("dropped: nothing")
        return
    title = f"dropped ({len(dropped)})"
    legend = "; ".join(f"{reason}: {_REASONS[reason]}" for reason in sorted({item.reason for item in dropped}))
    rows = [(item.category, "" if item.tick is None else str(item.tick), item.reason, item.text) for item in dropped]
    if not out.terminal:
        out.record(title)
    out.table(_DROPPED_COLUMNS, rows, title=title, caption=legend, right=("tick",),
              whole=("category", "tick", "reason"), stretch="text", fold=True, header=True)
    if not out.terminal:
        out.record(legend)


def dropped_json(explanation: TruncationExplanation) -> list[dict[str, Any]]:
    """Each dropped item as `{"category", "tick", "text", "reason"}` (tick null for facts and world state)."""
    return [msgspec.to_builtins(item) for item in explanation.dropped()]


def report_json(report: TruncationReport) -> dict[str, Any]:
    """The report as JSON, naming its selection even when it is the default (the encoding leaves it out)."""
    row: dict[str, Any] = msgspec.to_builtins(report)
    row["selection"] = report.selection
    return row
