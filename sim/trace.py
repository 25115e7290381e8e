"""Wire types a viewer reads besides `say`: the per-inference trace and a shard's roster.

The trace (`npcsim/{run}/trace/{shard}`, JSON) is published by the shard after each
inference: the truncation report, the prompt's SHA-256 and, unless the operator turns
prompts off (`npcsim run --no-trace-prompt`), the prompt itself. It is what the audit
record holds minus the state snapshot, so a viewer on another machine sees how each
prompt was cut without access to the shard's SQLite file.

The roster (`npcsim/{run}/roster/{shard}`, JSON, retained) lists a shard's NPCs and their
locations, so a viewer that connects late still knows the world.

Both are decoded with `forbid_unknown_fields` off: a viewer must keep working when a
newer shard adds a field.
"""

from __future__ import annotations

import msgspec

from sim.memory import TruncationReport

__all__ = [
    "RosterEntry",
    "RosterMessage",
    "TraceMessage",
    "decode_roster",
    "decode_trace",
    "encode_roster",
    "encode_trace",
]


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


class RosterEntry(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """`[id, name, location]`: an array keeps a 10,000-NPC roster small."""

    id: str
    name: str
    location: str


class RosterMessage(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    shard: str
    npcs: tuple[RosterEntry, ...]


_json = msgspec.json.Encoder()
_trace = msgspec.json.Decoder(TraceMessage)
_roster = msgspec.json.Decoder(RosterMessage)


def encode_trace(message: TraceMessage) -> bytes:
    return _json.encode(message)


def decode_trace(data: bytes) -> TraceMessage:
    """Raises msgspec.DecodeError (or ValidationError) on a malformed payload."""
    return _trace.decode(data)


def encode_roster(message: RosterMessage) -> bytes:
    return _json.encode(message)


def decode_roster(data: bytes) -> RosterMessage:
    return _roster.decode(data)
