"""An NPC's output beyond a line: the structured reply, its gates, what passes becomes.

    reply = read_reply(raw)                      # a RawReply, or why it is not one
    verdicts = gate_proposals(reply.beliefs, reply.remember, reply.intent,
                              facts=..., guarded=..., policy=..., guard=...)

`reply` holds the reply's shape (`REPLY_SCHEMA`, the retry's `SCHEMA_RULE`) and its repair
(`say_part`); `gates` the gates and their verdict codes (`CODES`), the knowledge boundaries
(`forbidden_phrase`); `apply` which proposals are applied (`said_proposals`) and what each
becomes in the NPC's state. The policy (`OutputPolicy`) and the verdicts
(`ProposalVerdict`) are `policy`'s types: an audit record keeps both. Output
handling (sim.inference) runs the gates on every attempt; the shard applies what passed,
the view shows it. Pure: no I/O. See docs/npc-output.md.
"""

from sim.output.apply import BELIEFS_PER_SUBJECT, Judged, belief_of, memory_of, said_proposals
from sim.output.gates import (
    CODES,
    MAX_ARG_CHARS,
    MAX_PROPOSAL_CHARS,
    Guard,
    accepted,
    clean_text,
    forbidden_phrase,
    gate_proposals,
    rejected,
)
from sim.output.policy import Arg, ArgType, OutputPolicy, ProposalVerdict
from sim.output.reply import REPLY_SCHEMA, SCHEMA_RULE, RawReply, read_reply, say_part

__all__ = [
    "Arg",
    "ArgType",
    "BELIEFS_PER_SUBJECT",
    "CODES",
    "MAX_ARG_CHARS",
    "MAX_PROPOSAL_CHARS",
    "REPLY_SCHEMA",
    "SCHEMA_RULE",
    "Guard",
    "Judged",
    "OutputPolicy",
    "ProposalVerdict",
    "RawReply",
    "accepted",
    "belief_of",
    "clean_text",
    "forbidden_phrase",
    "gate_proposals",
    "memory_of",
    "read_reply",
    "rejected",
    "said_proposals",
    "say_part",
]
