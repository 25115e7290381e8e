"""The inference transport's wire types (`infer/req`, `infer/resp/{shard}`, msgpack).

A request carries one NPC's working memory to a worker; a result carries what the NPC
says back, with every call made to the backend (the audit's attempts). One Encoder and
one typed Decoder per message type, module-level and reused; both types come from
outside the process, so they forbid unknown fields. Many of them travel in one message
(`sim.wire.batch`).
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

import msgspec

from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig
from sim.wire.attempt import Attempt, OutputPolicy
from sim.wire.decoding import msgpack_reader

__all__ = [
    "MAX_SERVERS",
    "WORKER_OFFLINE",
    "InferenceRequest",
    "InferenceResult",
    "Priority",
    "ServerLimits",
    "WorkerLimits",
    "decode_request",
    "decode_result",
    "decode_worker_limits",
    "encode_request",
    "encode_result",
    "encode_worker_limits",
]


WORKER_OFFLINE = msgspec.msgpack.encode("offline")
"""The body of a remote worker's last will on `infer/worker/{name}`: the broker publishes it
when the worker's connection dies without a goodbye (kill -9, a crash, a lost network)."""


class Priority(enum.IntEnum):
    """Lower is served first: a player waiting for an answer beats ambient chatter."""

    PLAYER = 0
    NPC = 1
    AMBIENT = 2


class InferenceRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One NPC's turn to speak: the working memory itself travels with the request.

    `deadline` is in unix seconds; a worker that picks the request up later drops it and
    answers with a fallback. `fallback_lines` are the NPC's persona lines for that case.
    `state` and `config` are what `memory` was built from: a worker rebuilds the memory
    with a prohibition from them when it retries a rejected reply, so the retry is a
    working memory inside the same budget. Without them a rejected reply is not retried.
    `output` is the NPC's output policy (a structured reply, forbidden phrases, intents:
    sim.output), None for a plain line.
    """

    id: str
    run_id: str
    agent_id: str
    tick: int
    memory: WorkingMemory
    deadline: float
    priority: Priority = Priority.NPC
    fallback_lines: tuple[str, ...] = ()
    seed: int = 0
    shard: str = "0"
    state: NpcState | None = None
    config: WorkingMemoryConfig | None = None
    output: OutputPolicy | None = None


MAX_SERVERS = 64
"""Model servers a result may name limits for: a worker's backend has a few, a forged result no more."""

ServerLimits = Annotated[dict[str, Annotated[int, msgspec.Meta(ge=1)]], msgspec.Meta(max_length=MAX_SERVERS)]
"""Each model server's adaptive limit on requests in flight, by the server's URL (no login)."""


MAX_COUNTED_TEXTS = 4096
"""Texts a result may give token counts for: a retry's build counts its items and a few prompts."""

TokenCounts = Annotated[dict[str, Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=MAX_COUNTED_TEXTS)]
"""A server tokenizer's counts a working memory was cut with, by text."""


class InferenceResult(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the NPC says and how it came about; `timings` in milliseconds.

    `fallback_reason` is one of "stale", "timeout", "circuit_open", "backend_error",
    "rejected", "transport_error" when `fallback` is true. `attempts` holds every call
    made to the backend, in order (none for a stale request). `counts` are the server
    tokenizer's counts a retry's working memory was cut with (`tokenizer = "server"`; empty
    otherwise): the audit keeps them, so the retry is rebuilt with no server.
    """

    id: str
    agent_id: str
    tick: int
    line: str
    raw_response: str | None
    backend: str
    model: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    fallback: bool = False
    fallback_reason: str | None = None
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    tokens: int | None = None
    worker: str = ""
    attempts: tuple[Attempt, ...] = ()
    prompt_tokens: int | None = None
    counts: TokenCounts = msgspec.field(default_factory=dict)


class WorkerLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a remote worker says on `infer/worker/{name}` when its model servers' adaptive
    limits changed (and now and then while it serves, for the pools that joined since): each
    server's limit, by URL. The pools sum them over the workers that serve on a server."""

    limits: ServerLimits


_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgpack_reader(InferenceRequest)
_result_decoder = msgpack_reader(InferenceResult)
_limits_decoder = msgpack_reader(WorkerLimits)


def encode_request(request: InferenceRequest) -> bytes:
    return _encoder.encode(request)


def decode_request(payload: bytes) -> InferenceRequest:
    """Raises msgspec.DecodeError; the transport translates it where the bytes arrive."""
    return _request_decoder.decode(payload)


def encode_result(result: InferenceResult) -> bytes:
    return _encoder.encode(result)


def decode_result(payload: bytes) -> InferenceResult:
    """Raises msgspec.DecodeError, as `decode_request` does."""
    return _result_decoder.decode(payload)


def encode_worker_limits(limits: WorkerLimits) -> bytes:
    return _encoder.encode(limits)


def decode_worker_limits(payload: bytes) -> WorkerLimits:
    """Raises msgspec.DecodeError, as `decode_request` does."""
    return _limits_decoder.decode(payload)
