"""Judging an NPC's reply, and what passes becomes: the one room for it. Pure: no I/O.

    verdict = judge_reply(raw, memory, Rules(max_line_chars=120, output=policy))

`judge` holds `judge_reply`, the one function from (raw reply, working memory, rules) to a
verdict, and its replay over an audit record's attempts (`judge_attempts`,
`gate_difference`, under `record_rules`); `line` cleans and judges a spoken line
(`clean_line`); `guard` the fact guard (`contradicted_fact`, `load_fact_guard`); `reply`
the structured reply's shape (`reply_schema`, bounded; `reply_tokens`, the most a reply of it
takes; the retry's `SCHEMA_RULE`) and its repair (`say_part`); `gates` the gates and their
verdict codes (`CODES`), the knowledge boundaries
(`forbidden_phrase`), what an intent's allow-list may hold (`allow_list_problem`) and what
passes it as JSON Schema (`intent_schemas`); `apply` which proposals are applied
(`said_proposals`) and what each becomes in the NPC's state.
The rules (`Rules`, `OutputPolicy`) and the verdicts (`ProposalVerdict`) are value types of
sim.wire.attempt, shared with the wire and the audit. The inference package calls
`judge_reply` on every attempt; the shard applies what passed, the view shows it; replay,
the audit and the load test judge again through here. See docs/npc-output.md.
"""

from sim.output.apply import BELIEFS_PER_SUBJECT, Judged, belief_of, memory_of, said_proposals, walked_to
from sim.output.gates import (
    CODES,
    MAX_ARG_CHARS,
    MAX_PROPOSAL_CHARS,
    RESERVED_NAMES,
    accepted,
    allow_list_problem,
    clean_text,
    forbidden_phrase,
    gate_proposals,
    intent_schemas,
    known_names,
    rejected,
)
from sim.output.guard import FactGuard, contradicted_fact, load_fact_guard
from sim.output.judge import FORBIDDEN_RULE, gate_difference, judge_attempts, judge_reply, record_rules
from sim.output.line import Verdict, clean_line
from sim.output.reply import SCHEMA_RULE, RawReply, longest_reply, read_reply, reply_schema, reply_tokens, say_part
from sim.wire.attempt import MAX_LINE_CHARS, Arg, ArgSpec, ArgType, OutputPolicy, ProposalVerdict, Rules, WorldValues

__all__ = [
    "Arg",
    "ArgSpec",
    "WorldValues",
    "ArgType",
    "BELIEFS_PER_SUBJECT",
    "CODES",
    "FORBIDDEN_RULE",
    "MAX_ARG_CHARS",
    "MAX_LINE_CHARS",
    "MAX_PROPOSAL_CHARS",
    "RESERVED_NAMES",
    "SCHEMA_RULE",
    "FactGuard",
    "Judged",
    "OutputPolicy",
    "ProposalVerdict",
    "RawReply",
    "Rules",
    "Verdict",
    "accepted",
    "allow_list_problem",
    "belief_of",
    "clean_line",
    "clean_text",
    "contradicted_fact",
    "forbidden_phrase",
    "gate_difference",
    "gate_proposals",
    "intent_schemas",
    "judge_attempts",
    "judge_reply",
    "longest_reply",
    "known_names",
    "load_fact_guard",
    "memory_of",
    "read_reply",
    "reply_schema",
    "reply_tokens",
    "record_rules",
    "rejected",
    "said_proposals",
    "walked_to",
    "say_part",
]
