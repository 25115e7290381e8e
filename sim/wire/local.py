"""The wire between a pool and its worker process (`sim.inference._local`): framed msgpack on pipes.

Every message is a frame: a 4-byte big-endian length, then that many bytes of msgpack.
The pool sends a `LocalWorkerConfig` first, then batches of `InferenceRequest`
(`sim.wire.batch`); the worker answers with a `LocalReply` when it is ready (or cannot
start: `error`), then with a `LocalReply` per batch of results. Both ends are the same
program, so a malformed frame is a bug, not an attack: it ends the worker.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from sim.wire.inference import InferenceResult

__all__ = ["FRAME_HEADER", "LocalReply", "LocalWorkerConfig", "decode_config", "decode_reply", "frame", "frame_size"]

FRAME_HEADER = 4
_LENGTH = struct.Struct(">I")


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
    error: str | None = None  # the worker could not start (its backend would not open)


_encoder = msgspec.msgpack.Encoder()
_config = msgspec.msgpack.Decoder(LocalWorkerConfig)
_reply = msgspec.msgpack.Decoder(LocalReply)


def frame(message: msgspec.Struct | list[Any] | bytes) -> bytes:
    """One frame: the message's msgpack (or the bytes as they are) behind its length."""
    body = message if isinstance(message, bytes) else _encoder.encode(message)
    return _LENGTH.pack(len(body)) + body


def frame_size(header: bytes) -> int:
    """The length of the body a frame's header announces."""
    (size,) = _LENGTH.unpack(header)
    return int(size)


def decode_config(body: bytes) -> LocalWorkerConfig:
    return _config.decode(body)


def decode_reply(body: bytes) -> LocalReply:
    return _reply.decode(body)
