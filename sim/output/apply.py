"""Which proposals are applied (`said_proposals`: the accepted ones of the reply said), and
what each becomes in the NPC's state: a belief keyed by its subject and text, or an
episodic memory.

A belief's id names its subject and a slot (`about:{subject}#{slot}`): the same belief
again (its text folded alike) refreshes its slot, a new one about the same subject takes a
free slot, and when the subject has `BELIEFS_PER_SUBJECT` already it replaces the oldest.
The store keeps one belief per id, so a subject never holds more than that and the newest
are the ones kept. Pure: the shard writes what these give with the NPC's authority.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sim.day import GO_TO
from sim.memory import Belief, Episode
from sim.text import fold
from sim.wire.attempt import ProposalVerdict

__all__ = ["BELIEFS_PER_SUBJECT", "Judged", "belief_of", "memory_of", "said_proposals", "walked_to"]


class Judged(Protocol):
    """An attempt with the gates' verdicts on its parts: the audit's `Attempt`, a trace's."""

    @property
    def proposals(self) -> tuple[ProposalVerdict, ...]: ...

BELIEFS_PER_SUBJECT = 3
"""Beliefs kept about one subject from proposals, at most: the newest."""


def belief_of(proposal: ProposalVerdict, beliefs: Sequence[Belief], tick: int) -> Belief:
    """The belief an accepted belief proposal writes, given the NPC's beliefs now."""
    prefix = f"about:{proposal.about}#"
    mine = [b for b in beliefs if b.id.startswith(prefix)]
    same = next((b for b in mine if fold(b.text) == fold(proposal.text)), None)
    if same is not None:
        slot = same.id
    elif len(mine) < BELIEFS_PER_SUBJECT:
        taken = {b.id for b in mine}
        slot = next(f"{prefix}{n}" for n in range(BELIEFS_PER_SUBJECT + 1) if f"{prefix}{n}" not in taken)
    else:
        slot = min(mine, key=lambda b: (b.tick, b.id)).id
    return Belief(id=slot, tick=tick, text=proposal.text, confidence=proposal.weight)


def memory_of(proposal: ProposalVerdict, inference_id: str, n: int, tick: int) -> Episode:
    """The episodic memory an accepted memory proposal writes: the `n`th of its inference."""
    return Episode(id=f"mem:{inference_id}:{n}", tick=tick, text=proposal.text, significance=proposal.weight)


def said_proposals(attempts: Sequence[Judged], *, fallback: bool) -> tuple[ProposalVerdict, ...]:
    """The proposals that are applied: those every gate accepted of the reply the NPC said
    (its last attempt); none for a fallback, whose reply is no model's."""
    if fallback or not attempts:
        return ()
    return tuple(p for p in attempts[-1].proposals if p.kind != "line" and p.verdict == "accepted")


def walked_to(proposal: ProposalVerdict) -> str | None:
    """Where an applied `go_to` walks its NPC (the engine moves it at the next tick), or None
    for any other proposal."""
    place = proposal.args.get("location")
    return place if proposal.kind == "intent" and proposal.text == GO_TO and isinstance(place, str) else None
