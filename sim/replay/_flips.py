"""The gates of a what-if: each recorded reply judged again under a variant's output policy.

A variant that sets `forbidden` or `intents` (`--set npc.ID.forbidden=...`) changes the
rules the gates apply, not what the NPC saw or said: each attempt's recorded raw reply is
judged again (`sim.output.judge_attempts`, the live path's code) under the record's rules
with the variant's policy, against the working memory it answered, and every part of it
whose verdict goes from accepted to rejected or back is a `Flip`. Records of NPCs without
an output policy have nothing to judge.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from sim.audit import AuditRecord
from sim.memory import WorkingMemory
from sim.output import OutputPolicy, judge_attempts, record_rules

__all__ = ["DIRECTIONS", "Flip", "first_flips", "flips"]

DIRECTIONS = ("to_rejected", "to_accepted")


class Flip(msgspec.Struct, frozen=True, kw_only=True):
    """One part of a recorded reply that the variant's rules judge otherwise than the run did.

    `kind` and `text` as in its `ProposalVerdict` ("line", "belief", "memory", "intent");
    `was`/`was_code` the recorded verdict and code, `now`/`now_code`/`detail` the variant's.
    """

    record: str
    agent: str
    tick: int
    attempt: int
    kind: str
    text: str
    was: str
    was_code: str
    now: str
    now_code: str
    detail: str = ""

    @property
    def direction(self) -> str:
        return "to_rejected" if self.now == "rejected" else "to_accepted"

    def order(self) -> tuple[int, str, str, int]:
        return (self.tick, self.agent, self.record, self.attempt)


def flips(record: AuditRecord, memory: WorkingMemory, policy: OutputPolicy) -> tuple[int, list[Flip]]:
    """How many attempts of `record` were judged again under `policy`, and the flips: the
    recorded verdicts against the new ones, part by part."""
    judged, found = 0, []
    rules = msgspec.structs.replace(record_rules(record), output=policy)
    for n, attempt, verdict in judge_attempts(record, memory, rules):
        judged += 1
        found += [
            Flip(record=record.id, agent=record.agent_id, tick=record.tick, attempt=n, kind=now.kind, text=now.text,
                 was=was.verdict, was_code=was.code, now=now.verdict, now_code=now.code, detail=now.detail)
            for was, now in zip(attempt.proposals, verdict.proposals, strict=False)
            if was.verdict != now.verdict and (was.kind, was.text) == (now.kind, now.text)
        ]
    return judged, found


def first_flips(found: Iterable[Flip], limit: int) -> list[Flip]:
    """The first `limit` flips of each direction, in the order given."""
    taken = dict.fromkeys(DIRECTIONS, 0)
    kept = []
    for flip in found:
        if taken[flip.direction] < limit:
            taken[flip.direction] += 1
            kept.append(flip)
    return kept
