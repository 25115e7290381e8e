"""A gate that accepts every proposal: the independent check (sim.checkers.proposals) must catch it."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sim.memory import Fact
from sim.output import FactGuard, OutputPolicy, ProposalVerdict, accepted, clean_text

__all__ = ["accept_every_proposal"]


def accept_every_proposal(
    beliefs: Sequence[Any], memories: Sequence[Any], intent: Any, *, facts: Sequence[Fact],
    guarded: Collection[str], known: Collection[str], policy: OutputPolicy, guard: FactGuard,
    world: Mapping[str, str] | None = None,
) -> tuple[ProposalVerdict, ...]:
    """`sim.output.gate_proposals` broken: every proposal of its shape is accepted as it came."""
    taken = [accepted("belief", clean_text(str(b.get("text", ""))), about=str(b.get("about", "")),
                      weight=float(b.get("confidence", 0))) for b in beliefs if isinstance(b, dict)]
    taken += [accepted("memory", clean_text(str(m.get("text", ""))), weight=float(m.get("significance", 0)))
              for m in memories if isinstance(m, dict)]
    if isinstance(intent, dict):
        taken.append(accepted("intent", str(intent.get("name", "")), args=dict(intent.get("args", {}))))
    return tuple(taken)
