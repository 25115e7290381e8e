"""Wire types a viewer reads besides `say`: the per-inference trace and a shard's roster.

The trace (`npcsim/{run}/trace/{shard}`, JSON) of each inference is published by the
shard in batches (sim.bus), a JSON array of traces in the order of their inferences, each
built from its audit record (`sim.audit.trace_of`, with `for_trace` here): the
truncation report and its explanation (each category's budget as split and after
redistribution, what it kept and what it dropped and why: `sim.memory.explain_truncation`,
derived from the record's snapshot), the prompt's SHA-256 and, unless the operator turns
prompts off (`npcsim run --set record.trace_prompts=false`), the prompt itself. It is what the audit
record holds minus the state snapshot, so a viewer on another machine sees how each prompt
was cut, and what the gates made of each attempt's proposals, without access to the shard's
SQLite file. The explanation names the newest
`TRACE_DROPPED` dropped items of each category (the report counts them all; `npcsim audit
show` lists every one); without prompts it keeps its numbers and reasons but no item's text.

The roster (`npcsim/{run}/roster/{shard}`, JSON, retained) lists a shard's NPCs and their
locations, so a viewer that connects late still knows the world.

Both are decoded with `forbid_unknown_fields` off: a viewer must keep working when a
newer shard adds a field.
"""

from __future__ import annotations

import msgspec

from sim.memory import TruncationExplanation, TruncationReport
from sim.wire.attempt import ProposalVerdict, Usage
from sim.wire.decoding import json_reader

__all__ = [
    "TRACE_DROPPED",
    "Recalled",
    "RosterEntry",
    "RosterMessage",
    "TraceAttempt",
    "TraceMessage",
    "decode_roster",
    "decode_traces",
    "encode_roster",
    "encode_trace",
    "for_trace",
]


class TraceAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """One call to the backend, as the audit's `Attempt` says, without its prompt (the size only).

    `usage` is what the model server said the call cost (None when no reply came);
    `proposals`: the gates' verdict on each part of its reply (the line, beliefs, memories,
    the intent) under the NPC's output policy (docs/npc-output.md); none without one."""

    prompt_chars: int
    raw_response: str | None = None
    problem: str | None = None
    prohibition: str | None = None
    usage: Usage | None = None
    proposals: tuple[ProposalVerdict, ...] = ()


class Recalled(msgspec.Struct, frozen=True, array_like=True):
    """`[id, text]`: a memory recall brought back (a summary of its place's talk when the id
    starts with `sum:`), its text as the prompt's item shows it."""

    id: str
    text: str


class TraceMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One inference as a viewer sees it; joins the `say` line by `inference_id`."""

    run: str
    shard: str
    agent: str
    location: str | None
    tick: int
    inference_id: str
    player_input: str
    line: str
    fallback: bool
    fallback_reason: str | None
    backend: str
    model: str
    prompt_sha256: str
    report: TruncationReport
    latency_ms: float | None = None
    prompt: str | None = None
    attempts: tuple[TraceAttempt, ...] = ()  # every call to the backend; more than one for a retry
    explanation: TruncationExplanation | None = None  # None from a shard that predates it
    recalled: tuple[Recalled, ...] = ()  # what recall brought back from the NPC's whole history


class RosterEntry(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """`[id, name, location]`: an array keeps a 10,000-NPC roster small."""

    id: str
    name: str
    location: str


class RosterMessage(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    shard: str
    npcs: tuple[RosterEntry, ...]


TRACE_DROPPED = 5
"""Dropped items named per category in a trace: the newest, those next in line to be kept."""
_CATEGORIES = ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs")


def for_trace(explanation: TruncationExplanation, *, texts: bool) -> TruncationExplanation:
    """The explanation as a trace carries it (built with at most `TRACE_DROPPED` dropped items
    per category), or, prompts off, with no item's text at all."""
    if texts:
        return explanation
    bare = {name: msgspec.structs.replace(getattr(explanation, name), dropped=(), kept_items=())
            for name in _CATEGORIES}
    return msgspec.structs.replace(explanation, **bare)


_json = msgspec.json.Encoder()
_trace = json_reader(TraceMessage)
_traces = json_reader(list[TraceMessage])
_roster = json_reader(RosterMessage)


def encode_trace(message: TraceMessage) -> bytes:
    return _json.encode(message)


def decode_traces(data: bytes) -> list[TraceMessage]:
    """The traces of a `trace/{shard}` payload: a batch (a JSON array), or one trace object
    as a batch of one. Raises msgspec.DecodeError (or ValidationError) on a malformed payload,
    an empty batch included: no shard sends one, so a viewer counts it rather than skip it."""
    if data.lstrip()[:1] == b"{":
        return [_trace.decode(data)]
    traces = _traces.decode(data)
    if not traces:
        raise msgspec.DecodeError("an empty batch of traces")
    return traces


def encode_roster(message: RosterMessage) -> bytes:
    return _json.encode(message)


def decode_roster(data: bytes) -> RosterMessage:
    return _roster.decode(data)
