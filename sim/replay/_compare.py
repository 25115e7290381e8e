"""Comparing a re-execution with its original: the first divergence, or `identical`.

Every audit record is compared by id, in (tick, NPC, id) order: each attempt's prompt
digest, the line said, the fallback. The first record that differs, or that only one side
has, is the divergence: its tick, its NPC and what differs, in words: which category of
the working memory gained or lost which item, which attempt's prompt changed, the line.
Then, when the re-execution went to the original's last tick, every NPC's and every
place's final state in the stores (`StoreReader.final_state`), category by category.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import msgspec

from sim.audit import AuditRecord
from sim.errors import NpcsimError
from sim.memory import WorkingMemory
from sim.store import open_reader

__all__ = ["CATEGORIES", "Comparison", "Divergence", "compare_records", "compare_states", "memory_changes"]

CATEGORIES = ("canonical_facts", "world_state", "beliefs", "episodic", "dialogue")
_SHOWN = 60  # characters of an item or a line shown in a divergence


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """Where a re-execution first differs from its original, and what differs there."""

    tick: int
    npc: str
    what: str

    def describe(self) -> str:
        return f"tick {self.tick}, NPC {self.npc}: {self.what}"


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    records: int  # compared (the original's)
    npcs: int  # whose final state was compared
    divergence: Divergence | None = None


def compare_records(original: Mapping[str, AuditRecord], again: Mapping[str, AuditRecord]) -> Divergence | None:
    """The first record, in (tick, NPC, id) order, that differs or that one side lacks."""
    keys = sorted({*original, *again}, key=lambda i: _order(original.get(i) or again[i]))
    for key in keys:
        a, b = original.get(key), again.get(key)
        if a is None:
            assert b is not None
            return Divergence(tick=b.tick, npc=b.agent_id, what=f"the re-execution made inference {key}, which the "
                              f"original did not (it said {_short(b.line)})")
        if b is None:
            return Divergence(tick=a.tick, npc=a.agent_id, what=f"the original's inference {key} was not made "
                              f"again (it said {_short(a.line)})")
        what = record_difference(a, b)
        if what:
            return Divergence(tick=a.tick, npc=a.agent_id, what=f"inference {key}: {what}")
    return None


def record_difference(a: AuditRecord, b: AuditRecord) -> str:
    """What differs between two records of one inference, in words ("" when nothing)."""
    if a.prompt_sha256 != b.prompt_sha256:
        return "the prompt changed: " + (memory_changes(_memory(a), _memory(b)) or "the same items, rendered otherwise")
    for n, (x, y) in enumerate(zip(a.attempts, b.attempts, strict=False), 1):
        if _digest(x.prompt) != _digest(y.prompt):
            return f"attempt {n}'s prompt changed"
    if len(a.attempts) != len(b.attempts):
        return f"{len(a.attempts)} attempts in the original, {len(b.attempts)} in the re-execution"
    if a.fallback != b.fallback:
        side = "the re-execution" if b.fallback else "the original"
        reason = b.fallback_reason if b.fallback else a.fallback_reason
        return f"only {side} fell back ({reason})"
    if a.line != b.line:
        return f"said {_short(b.line)} where the original said {_short(a.line)}"
    return ""


def memory_changes(before: WorkingMemory | None, after: WorkingMemory | None) -> str:
    """Per category, the items `after` gained and lost against `before`: "episodic: gained 'x'; ..."."""
    if before is None or after is None:
        return "its working memory does not rebuild"
    parts = []
    for category in CATEGORIES:
        old = [_item(i) for i in getattr(before, category)]
        new = [_item(i) for i in getattr(after, category)]
        gained, lost = [i for i in new if i not in old], [i for i in old if i not in new]
        if gained or lost:
            said = [f"gained {', '.join(_short(i) for i in gained)}"] if gained else []
            said += [f"lost {', '.join(_short(i) for i in lost)}"] if lost else []
            parts.append(f"{category}: {'; '.join(said)}")
    if before.player_input != after.player_input:
        parts.append(f"input: {_short(after.player_input)} instead of {_short(before.player_input)}")
    return "; ".join(parts)


def compare_states(original: Sequence[Path], again: Path) -> tuple[int, Divergence | None]:
    """How many NPCs were compared, and the first one (or place) whose final state differs."""
    before: dict[str, dict[str, list[tuple[object, ...]]]] = {}
    for path in original:
        with open_reader(path) as reader:
            before.update(reader.final_state())
    with open_reader(again) as reader:
        after = reader.final_state()
    npcs = sum(1 for key in before if not key.startswith("place:"))
    for key in sorted({*before, *after}):
        a, b = before.get(key, {}), after.get(key, {})
        for category in sorted({*a, *b}):
            old, new = a.get(category, []), b.get(category, [])
            if old != new:
                gained = [r for r in new if r not in old]
                lost = [r for r in old if r not in new]
                said = [f"gained {_short(repr(gained[0]))}"] if gained else []
                said += [f"lost {_short(repr(lost[0]))}"] if lost else []
                tick = min((int(r[0]) for r in (*gained, *lost) if isinstance(r[0], int)), default=-1)
                return npcs, Divergence(tick=tick, npc=key, what=f"final state, {category}: "
                                        f"{'; '.join(said) or 'in another order'} ({len(old)} rows, now {len(new)})")
    return npcs, None


def records_of(paths: Iterable[Path], until: int | None = None) -> dict[str, AuditRecord]:
    """Every audit record of the stores (of the ticks before `until`), by id."""
    records: dict[str, AuditRecord] = {}
    for path in paths:
        with open_reader(path) as reader:
            to = None if until is None else until - 1
            records.update((r.id, r) for r in reader.audit_records(to_tick=to))
    return records


def _order(record: AuditRecord) -> tuple[int, str, str]:
    return record.tick, record.agent_id, record.id


def _memory(record: AuditRecord) -> WorkingMemory | None:
    try:
        return record.memory()
    except (NpcsimError, ValueError):
        return None


def _item(item: object) -> str:
    text = getattr(item, "text", None)
    if isinstance(text, str):
        return text
    return f"{getattr(item, 'key', '')}={getattr(item, 'value', '')}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _short(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "...")
