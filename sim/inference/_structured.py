"""Output handling under an NPC's output policy: a structured reply read, repaired and gated.

`judge_reply` is what serving and the pool's reply checks call for every attempt:

- no policy: the line as output handling judges it (`judge`);
- a policy, `structured` false: that line, refused (`forbidden`) when it reveals a phrase
  the author forbade;
- `structured`: the reply is read as a JSON object (sim.output.read_reply). One that is not
  is refused (`parse`) with the schema as the retry's rule; on the retry, the `say` part
  alone is said when it can be found (`salvaged`, no proposals), else the fallback speaks.
  The `say` is judged as a line (`empty`, `canonical_fact`, `forbidden`); every proposal
  goes through the gates (sim.output.gate_proposals), whether the line passed or not, so
  the audit holds every verdict of every attempt.

The verdict's `proposals` start with the line's own (kind "line"). Each rule is a
function of the raw reply, the working memory and the policy, so `judge_attempts` judges
a record's attempts again: `gate_difference` (what `npcsim audit replay` runs) under the
record's own policy, finding the same verdicts, and the what-if (`npcsim replay --set
npc.ID.forbidden=...`) under another.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from sim.audit import Attempt, AuditRecord
from sim.inference._guard import FactGuard, contradicted_fact
from sim.inference._output import Verdict, judge
from sim.memory import WorkingMemory
from sim.output import SCHEMA_RULE, accepted, forbidden_phrase, gate_proposals, read_reply, rejected, say_part
from sim.output.policy import OutputPolicy

__all__ = ["FORBIDDEN_RULE", "gate_difference", "judge_attempts", "judge_reply"]

FORBIDDEN_RULE = "Never reveal what you must keep secret; answer without it."
"""The retry's rule after a line that revealed a forbidden phrase (the phrase itself is not repeated)."""


def judge_reply(
    raw: str, memory: WorkingMemory, max_chars: int, guard: FactGuard = contradicted_fact,
    policy: OutputPolicy | None = None,
) -> Verdict:
    """Judge one attempt's raw reply under `policy` (None: a line, as `judge` does)."""
    if policy is None:
        return judge(raw, memory, max_chars, guard)
    if not policy.structured:
        return _line(judge(raw, memory, max_chars, guard), policy, salvaged=False)
    reply = read_reply(raw)
    if isinstance(reply, str):
        said = say_part(raw) if memory.prohibition is not None else None
        if said is None:
            return Verdict(line="", problem=f"parse: {reply}", prohibition=SCHEMA_RULE, code="parse",
                           proposals=(rejected("line", "", "parse", reply),))
        return _line(judge(said, memory, max_chars, guard), policy, salvaged=True)
    line = _line(judge(reply.say, memory, max_chars, guard), policy, salvaged=False)
    guarded = {f.id for f in memory.canonical_facts} | {w.key for w in memory.world_state}
    proposals = gate_proposals(reply.beliefs, reply.remember, reply.intent, facts=memory.canonical_facts,
                               guarded=guarded, policy=policy, guard=guard)
    return msgspec.structs.replace(line, proposals=line.proposals + proposals)


def _line(verdict: Verdict, policy: OutputPolicy, *, salvaged: bool) -> Verdict:
    """The line's verdict with the knowledge boundaries applied and its own proposal verdict."""
    if verdict.problem is None and (phrase := forbidden_phrase(verdict.line, policy.forbidden)) is not None:
        detail = f"reveals forbidden phrase #{policy.forbidden.index(phrase) + 1}"
        verdict = Verdict(line=verdict.line, problem=f"forbidden: {detail}", prohibition=FORBIDDEN_RULE,
                          code="forbidden")
    if verdict.problem is not None:
        mine = rejected("line", verdict.line, verdict.code, verdict.problem)
    elif salvaged:
        mine = msgspec.structs.replace(accepted("line", verdict.line), code="salvaged",
                                       detail="the say part of a reply that is not valid JSON")
    else:
        mine = accepted("line", verdict.line)
    return msgspec.structs.replace(verdict, proposals=(mine,))


def judge_attempts(
    record: AuditRecord, memory: WorkingMemory, policy: OutputPolicy, *, guard: FactGuard = contradicted_fact,
    max_line_chars: int = 200,
) -> Iterator[tuple[int, Attempt, Verdict]]:
    """Each attempt of `record` with a reply (its number from 1) and the gates' verdict on it
    under `policy`, against the working memory it answered (`memory`, the record's; a
    retry's is rebuilt with its prohibition)."""
    for n, attempt in enumerate(record.attempts, 1):
        if attempt.raw_response is None:
            continue
        given = memory if attempt.prohibition is None else record.memory(attempt.prohibition)
        yield n, attempt, judge_reply(attempt.raw_response, given, max_line_chars, guard, policy)


def gate_difference(
    record: AuditRecord, memory: WorkingMemory, *, guard: FactGuard = contradicted_fact, max_line_chars: int = 200
) -> str:
    """The first attempt of `record` whose reply the gates now judge otherwise, or "".

    `memory` is the record's working memory (a retry's is rebuilt with its prohibition);
    `guard` and `max_line_chars` are what the run judged with (the built-in guard and the
    default bound unless it was configured otherwise). A record without attempts under an
    output policy has nothing to compare.
    """
    if record.output is None:
        return ""
    for n, attempt, verdict in judge_attempts(record, memory, record.output, guard=guard,
                                              max_line_chars=max_line_chars):
        if verdict.problem != attempt.problem:
            return f"gates: attempt {n}: recorded problem {attempt.problem!r}, now {verdict.problem!r}"
        for recorded, now in zip(attempt.proposals, verdict.proposals, strict=False):
            if recorded != now:
                return (f"gates: attempt {n}: {recorded.kind} {recorded.text[:60]!r} was {recorded.verdict} "
                        f"({recorded.code}), now {now.kind} {now.text[:60]!r} {now.verdict} ({now.code})")
        if len(attempt.proposals) != len(verdict.proposals):
            return f"gates: attempt {n}: {len(attempt.proposals)} verdicts recorded, {len(verdict.proposals)} now"
    return ""
