"""The wire between a shard and its helper processes (`sim.helper`): framed msgpack on pipes.

Every message is a frame: a 4-byte big-endian length, then that many bytes of msgpack. The
parent sends a configuration first; the helper answers with a `Hello` when it is ready (or
cannot start: `error`); then each side sends its frames. For the pool's worker process
(`sim.inference._local`): a `LocalWorkerConfig`, then batches of `InferenceRequest`
(`sim.wire.batch`) one way and a `LocalReply` per batch of results back.

Both ends are the same program, so a malformed frame is a bug, not an attack: it ends the
helper, which its parent starts again.
"""

from __future__ import annotations

import struct
from typing import Any, TypeVar

import msgspec

from sim.wire.inference import InferenceResult

__all__ = [
    "FRAME_HEADER",
    "Hello",
    "LocalReply",
    "LocalWorkerConfig",
    "decode",
    "encode",
    "frame",
    "frame_size",
]

FRAME_HEADER = 4
_LENGTH = struct.Struct(">I")
T = TypeVar("T")


class Hello(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A helper's first answer: ready, or why it cannot start."""

    error: str | None = None


class LocalWorkerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the worker process serves with: the pool's backend, bounds and fact guard."""

    backend: str
    options: dict[str, Any]
    concurrency: int
    timeout: float
    max_line_chars: int
    fact_guard: str
    log_level: int


class LocalReply(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Results served since the last reply, with the worker's running counts of what the
    pool's statistics hold and only serving sees (rejected outputs, stale requests)."""

    results: list[InferenceResult] = []
    rejected_outputs: int = 0
    dropped_stale: int = 0


_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {
    kind: msgspec.msgpack.Decoder(kind)
    for kind in (Hello, LocalWorkerConfig, LocalReply)
}


def encode(message: msgspec.Struct) -> bytes:
    """A message as a frame's body."""
    return _encoder.encode(message)


def decode(body: bytes, kind: type[T]) -> T:
    """A frame's body as `kind` (one of this module's types); raises msgspec.DecodeError."""
    decoder: msgspec.msgpack.Decoder[T] = _decoders[kind]
    return decoder.decode(body)


def frame(body: bytes) -> bytes:
    """One frame: the body behind its length."""
    return _LENGTH.pack(len(body)) + body


def frame_size(header: bytes) -> int:
    """The length of the body a frame's header announces."""
    (size,) = _LENGTH.unpack(header)
    return int(size)
