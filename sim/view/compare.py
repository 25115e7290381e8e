"""Two stores' working memories of one NPC side by side (`npcsim view --db FILE --compare OTHER.db`).

The other store is typically the same run under another budget or model (a fork, or a run
with another config); for the chosen NPC and tick each side is the NPC's newest record at
or before that tick, its working memory rebuilt from the record's snapshot. Items are
matched by their content: an item of this side's memory that the other's lacks is what
the other *lost*, one only the other holds is what it *gained*.

Only each store's index (agent, tick, record id) is held; the two records are read when
asked for, so a 10,000-NPC store costs the view its index, not its records.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import msgspec

from sim.memory import Belief, Episode, Fact, Line, WorkingMemory, WorldFact
from sim.store import open_reader

__all__ = ["CATEGORIES", "StoreComparison"]

CATEGORIES = ("canonical_facts", "world_state", "beliefs", "episodic", "dialogue")

_KEY = msgspec.json.Encoder()

Item = Fact | WorldFact | Belief | Episode | Line


def _text(item: Item) -> str:
    """The item as the page shows it (as text, never as HTML)."""
    if isinstance(item, Line):
        return f"{item.speaker}: {item.text}"
    if isinstance(item, WorldFact):
        return f"{item.key}: {item.value}"
    if isinstance(item, Episode):
        return f"[tick {item.tick}] {item.text}"
    return item.text


class _Index:
    """One store's records by NPC: ticks and record ids, in tick order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open_reader(path) as reader:
            summaries = reader.audit_summaries()  # ordered by (tick, agent, id)
        self._ticks: dict[str, list[int]] = {}
        self._ids: dict[str, list[str]] = {}
        for s in summaries:
            self._ticks.setdefault(s.agent_id, []).append(s.tick)
            self._ids.setdefault(s.agent_id, []).append(s.id)

    def knows(self, agent: str) -> bool:
        return agent in self._ids

    def memory(self, agent: str, tick: int | None) -> tuple[str, int, WorkingMemory] | None:
        """(record id, its tick, its working memory) of the newest record of `agent` at or before `tick`."""
        ticks = self._ticks.get(agent)
        if not ticks:
            return None
        n = len(ticks) if tick is None else bisect.bisect_right(ticks, tick)
        if n == 0:
            return None
        record_id = self._ids[agent][n - 1]
        with open_reader(self.path) as reader:
            record = reader.audit_record(record_id)
        return record_id, record.tick, record.memory()


class StoreComparison:
    """`compare(agent, tick)`: the page's side-by-side view of two stores' working memories."""

    def __init__(self, this: Path, other: Path) -> None:
        self._sides = (_Index(this), _Index(other))
        self.other_name = other.name

    def compare(self, agent: str, tick: int | None) -> dict[str, Any] | None:
        """Both sides (None for a side without a record of `agent` by `tick`); None for an NPC neither knows."""
        if not any(side.knows(agent) for side in self._sides):
            return None
        found = [side.memory(agent, tick) for side in self._sides]
        keys = [
            {c: {_KEY.encode(i) for i in getattr(m[2], c)} for c in CATEGORIES} if m is not None else None
            for m in found
        ]
        sides: list[dict[str, Any]] = []
        for n, (side, one) in enumerate(zip(self._sides, found, strict=True)):
            if one is None:
                sides.append({"store": side.path.name, "record": None})
                continue
            record_id, record_tick, memory = one
            theirs = keys[1 - n]
            mark = "lost" if n == 0 else "gained"
            report = memory.report
            sides.append({
                "store": side.path.name,
                "record": record_id,
                "tick": record_tick,
                "prompt_chars": report.prompt_chars,
                "limit_chars": report.limit_chars,
                "over_budget": report.over_budget,
                "selection": report.selection,
                "categories": {
                    c: [{"text": _text(i),
                         "mark": mark if theirs is not None and _KEY.encode(i) not in theirs[c] else ""}
                        for i in getattr(memory, c)]
                    for c in CATEGORIES
                },
            })
        return {"agent": agent, "tick": tick, "this": sides[0], "other": sides[1]}
