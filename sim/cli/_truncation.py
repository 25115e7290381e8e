"""Truncation as the CLI shows it: the report's table, then what was dropped (and a JSON list).

`audit show`, `memory show` and `audit export` use these; the explanation itself is
`sim.memory.explain_truncation` (derived from the snapshot, never stored).
"""

from __future__ import annotations

from typing import Any

import msgspec
from rich.table import Table
from rich.text import Text

from sim.memory import TruncationExplanation, TruncationReport

__all__ = ["dropped_json", "dropped_table", "report_table"]

_REASONS = {
    "cap": "the count cap was reached",
    "budget": "did not fit what was left",
    "over_budget": "mandatory content took the whole limit",
}


def report_table(report: TruncationReport, explanation: TruncationExplanation) -> Table:
    """One row per category: its budget as split and after redistribution, what it used, kept and dropped.

    Canonical facts and world state are mandatory (always included): they take what they
    need, from the limit, before the split.
    """
    table = Table(title_justify="left", show_edge=False)
    for column in ("category", "split", "after redistribution", "used", "kept", "dropped", "reason"):
        table.add_column(column, justify="left" if column in ("category", "reason") else "right")
    for name in ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs"):
        row = getattr(explanation, name)
        delta = row.final - row.split
        after = "" if row.mandatory else f"{row.final} ({delta:+d})" if delta else str(row.final)
        table.add_row(name, "mandatory" if row.mandatory else str(row.split), after, str(row.used), str(row.kept),
                      str(len(row.dropped)), row.reason or "")
    tokens = f", {report.prompt_tokens}/{report.limit_tokens} tokens" if report.limit_tokens else ""
    flag = " [bold red]OVER BUDGET[/]" if report.over_budget else ""
    table.caption = (
        f"limit {report.limit_chars} chars: prompt {report.prompt_chars}{tokens}; mandatory {report.mandatory_chars}, "
        f"split between the others {max(explanation.flexible_chars, 0)}, left unused {explanation.unused_chars}{flag}"
    )
    return table


def dropped_json(explanation: TruncationExplanation) -> list[dict[str, Any]]:
    """Each dropped item as `{"category", "tick", "text", "reason"}` (tick null for facts and world state)."""
    return [msgspec.to_builtins(item) for item in explanation.dropped()]


def dropped_table(explanation: TruncationExplanation) -> Table | Text:
    """One row per dropped item, newest first in each category; the caption says what the reasons mean."""
    dropped = explanation.dropped()
    if not dropped:
        return Text("dropped: nothing")
    table = Table(title=f"dropped ({len(dropped)})", title_justify="left", show_edge=False)
    for column in ("category", "tick", "reason", "text"):
        table.add_column(column, justify="right" if column == "tick" else "left", overflow="fold",
                         ratio=1 if column == "text" else None)
    for item in dropped:
        table.add_row(item.category, "" if item.tick is None else str(item.tick), item.reason, Text(item.text))
    used = sorted({item.reason for item in dropped})
    table.caption = "; ".join(f"{reason}: {_REASONS[reason]}" for reason in used)
    return table
