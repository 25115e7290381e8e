"""Judging a reply: one pure function from (raw reply, working memory, rules) to a verdict.

`judge_reply` is what serving and the pool's reply checks call for every attempt, and what
a replay calls again. The rules (`Rules`, sim.wire.attempt) are one value: the line limit,
the fact guard's name and the NPC's output policy:

- no policy: the line as `judge_line` judges it (sim.output.line);
- a policy, `structured` false: that line, refused (`forbidden`) when it reveals a phrase
  the author forbade;
- `structured`: the reply is read as a JSON object (sim.output.read_reply). One that is not
  is refused (`parse`) with the schema as the retry's rule; on the retry, the `say` part
  alone is said when it can be found (`salvaged`, no proposals), else the fallback speaks.
  The `say` is judged as a line (`empty`, `canonical_fact`, `forbidden`); every proposal
  goes through the gates (sim.output.gate_proposals), whether the line passed or not, so
  the audit holds every verdict of every attempt.

The verdict's `proposals` start with the line's own (kind "line"). An audit record keeps
the rules its replies were judged under (`record_rules`), so `judge_attempts` judges its
attempts again as the run did: `gate_difference` (what `npcsim audit replay` runs) under
the record's own rules, finding the same verdicts, and the what-if (`npcsim replay --set
npc.ID.forbidden=...`) under another policy.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from sim.audit import AuditRecord
from sim.memory import WorkingMemory
from sim.output.gates import accepted, forbidden_phrase, gate_proposals, known_names, rejected
from sim.output.guard import FactGuard, load_fact_guard
from sim.output.line import Verdict, judge_line
from sim.output.reply import SCHEMA_RULE, read_reply, say_part
from sim.wire.attempt import Attempt, OutputPolicy, Rules

__all__ = ["FORBIDDEN_RULE", "gate_difference", "judge_attempts", "judge_reply", "record_rules"]

FORBIDDEN_RULE = "Never reveal what you must keep secret; answer without it."
"""The retry's rule after a line that revealed a forbidden phrase (the phrase itself is not repeated)."""


def judge_reply(raw: str, memory: WorkingMemory, rules: Rules, guard: FactGuard | None = None) -> Verdict:
    """Judge one attempt's raw reply under `rules`; `guard` is a fact guard handed in instead
    of the one `rules.fact_guard` names (a callable plugged into a pool in-process)."""
    guard = guard if guard is not None else load_fact_guard(rules.fact_guard)
    policy = rules.output
    if policy is None:
        return judge_line(raw, memory, rules.max_line_chars, guard)
    if not policy.structured:
        return _line(judge_line(raw, memory, rules.max_line_chars, guard), policy, salvaged=False)
    reply = read_reply(raw)
    if isinstance(reply, str):
        said = say_part(raw) if memory.prohibition is not None else None
        if said is None:
            return Verdict(line="", problem=f"parse: {reply}", prohibition=SCHEMA_RULE, code="parse",
                           proposals=(rejected("line", "", "parse", reply),))
        return _line(judge_line(said, memory, rules.max_line_chars, guard), policy, salvaged=True)
    line = _line(judge_line(reply.say, memory, rules.max_line_chars, guard), policy, salvaged=False)
    guarded = {f.id for f in memory.canonical_facts} | {w.key for w in memory.world_state}
    proposals = gate_proposals(reply.beliefs, reply.remember, reply.intent, facts=memory.canonical_facts,
                               guarded=guarded, known=known_names(memory), policy=policy, guard=guard,
                               world={w.key: w.value for w in memory.world_state})
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


def record_rules(record: AuditRecord) -> Rules:
    """The rules `record`'s replies were judged under: the run's (`record.rules`) with the
    NPC's output policy, which the record keeps in its own field (`record.output`)."""
    return msgspec.structs.replace(record.rules, output=record.output)


def judge_attempts(
    record: AuditRecord, memory: WorkingMemory, rules: Rules, guard: FactGuard | None = None
) -> Iterator[tuple[int, Attempt, Verdict]]:
    """Each attempt of `record` with a reply (its number from 1) and its verdict under
    `rules`, against the working memory it answered (`memory`, the record's; a retry's is
    rebuilt with its prohibition)."""
    for n, attempt in enumerate(record.attempts, 1):
        if attempt.raw_response is None:
            continue
        given = memory if attempt.prohibition is None else record.memory(attempt.prohibition)
        yield n, attempt, judge_reply(attempt.raw_response, given, rules, guard)


def gate_difference(record: AuditRecord, memory: WorkingMemory) -> str:
    """The first attempt of `record` whose reply the gates now judge otherwise, or "".

    `memory` is the record's working memory (a retry's is rebuilt with its prohibition);
    the attempts are judged under the rules the record keeps (`record_rules`). A record
    without an output policy has no gates to compare.
    """
    if record.output is None:
        return ""
    for n, attempt, verdict in judge_attempts(record, memory, record_rules(record)):
        if verdict.problem != attempt.problem:
            return f"gates: attempt {n}: recorded problem {attempt.problem!r}, now {verdict.problem!r}"
        for recorded, now in zip(attempt.proposals, verdict.proposals, strict=False):
            if recorded != now:
                return (f"gates: attempt {n}: {recorded.kind} {recorded.text[:60]!r} was {recorded.verdict} "
                        f"({recorded.code}), now {now.kind} {now.text[:60]!r} {now.verdict} ({now.code})")
        if len(attempt.proposals) != len(verdict.proposals):
            return f"gates: attempt {n}: {len(attempt.proposals)} verdicts recorded, {len(verdict.proposals)} now"
    return ""
