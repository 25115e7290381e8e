"""The wire between a shard and its helper processes (`sim.helper`): framed msgpack on pipes.

Every message is a frame: a 4-byte big-endian length, then that many bytes of msgpack. The
parent sends a configuration first; the helper answers with a `Hello` when it is ready (or
cannot start: `error`); then each side sends its frames. For the pool's worker process
(`sim.inference._local`): a `LocalWorkerConfig`, then batches of `InferenceRequest`
(`sim.wire.batch`) one way and a `LocalReply` per batch of results back. For the scenario
parser (`sim.shard._startup`): a `ParseScenario`, then `ParsedPart`s back, the scenario's
head, its NPCs in chunks, and `ParseDone` (or `ParseFailed`); the head and the NPCs stay
msgpack of the scenario's own types (`msgspec.Raw`), decoded by the parent.

Both ends are the same program, so a malformed frame is a bug, not an attack: it ends the
helper, which its parent starts again.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from sim.wire.attempt import Rules
from sim.wire.inference import InferenceResult, ServerLimits

__all__ = [
    "FRAME_HEADER",
    "Hello",
    "LocalReply",
    "LocalWorkerConfig",
    "ParseDone",
    "ParseFailed",
    "ParseScenario",
    "ParsedHead",
    "ParsedNpcs",
    "ParsedPart",
    "decode_config",
    "decode_hello",
    "decode_parse",
    "decode_parsed",
    "decode_reply",
    "encode",
    "frame",
    "frame_size",
]

FRAME_HEADER = 4
_LENGTH = struct.Struct(">I")


class Hello(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A helper's first answer: ready, or why it cannot start."""

    error: str | None = None


class LocalWorkerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the worker process serves with: the pool's backend, bounds and judging rules."""

    backend: str
    options: dict[str, Any]
    concurrency: int
    timeout: float
    rules: Rules
    log_level: int


class LocalReply(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Results served since the last reply, with what the pool's statistics count and only
    serving sees (outputs rejected, stale requests dropped) since the last reply too, and the
    model servers' adaptive limits now (`server_limits`, an `openai` backend's)."""

    results: list[InferenceResult] = []
    rejected_outputs: int = 0
    dropped_stale: int = 0
    server_limits: ServerLimits = {}


class ParseScenario(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the scenario parser parses: the bytes read, and the file they came from (its errors name it)."""

    source: str
    data: bytes


class ParsedHead(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="head"):
    """The scenario without its NPCs: msgpack of a `sim.scenario.Scenario`."""

    scenario: msgspec.Raw


class ParsedNpcs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="npcs"):
    """A chunk of the scenario's NPCs: msgpack of a list of `sim.scenario.NpcSpec`."""

    npcs: msgspec.Raw


class ParseFailed(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="failed"):
    """Why the scenario did not parse, word for word as the parser said it."""

    error: str


class ParseDone(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="done"):
    """The last part: the scenario is whole."""


ParsedPart = ParsedHead | ParsedNpcs | ParseFailed | ParseDone

_encoder = msgspec.msgpack.Encoder()
_hello = msgspec.msgpack.Decoder(Hello)
_config = msgspec.msgpack.Decoder(LocalWorkerConfig)
_reply = msgspec.msgpack.Decoder(LocalReply)
_parse = msgspec.msgpack.Decoder(ParseScenario)
_parsed: msgspec.msgpack.Decoder[ParsedPart] = msgspec.msgpack.Decoder(ParsedPart)


def encode(message: Hello | LocalWorkerConfig | LocalReply | ParseScenario | ParsedPart) -> bytes:
    """A message as a frame's body."""
    return _encoder.encode(message)


def decode_hello(body: bytes) -> Hello:
    """Raises msgspec.DecodeError, as the other two do."""
    return _hello.decode(body)


def decode_config(body: bytes) -> LocalWorkerConfig:
    return _config.decode(body)


def decode_reply(body: bytes) -> LocalReply:
    return _reply.decode(body)


def decode_parse(body: bytes) -> ParseScenario:
    return _parse.decode(body)


def decode_parsed(body: bytes) -> ParsedPart:
    return _parsed.decode(body)


def frame(body: bytes) -> bytes:
    """One frame: the body behind its length."""
    return _LENGTH.pack(len(body)) + body


def frame_size(header: bytes) -> int:
    """The length of the body a frame's header announces."""
    (size,) = _LENGTH.unpack(header)
    return int(size)
