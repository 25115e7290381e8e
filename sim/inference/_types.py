"""Wire and configuration types of the inference pool, and their module-level codecs.

Requests and results cross the MQTT transport as msgpack; one Encoder and one typed
Decoder per message type, reused. What comes from outside forbids unknown fields.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec

from sim.audit import Attempt
from sim.errors import ConfigError
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig
from sim.mqtt import BrokerAddress, ReconnectPolicy
from sim.protocol.seal import RunKey

__all__ = [
    "InferenceRequest",
    "InferenceResult",
    "PoolConfig",
    "PoolStatistics",
    "Priority",
    "Reply",
    "WorkerConfig",
    "decode_request",
    "decode_result",
    "encode_request",
    "encode_result",
]

Transport = Literal["inprocess", "mqtt"]


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


class InferenceResult(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the NPC says and how it came about; `timings` in milliseconds.

    `fallback_reason` is one of "stale", "timeout", "circuit_open", "backend_error",
    "rejected", "transport_error" when `fallback` is true. `attempts` holds every call
    made to the backend, in order (none for a stale request).
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


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """A backend's raw answer, before output handling; `tokens` counts the completion."""

    text: str
    model: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    tokens: int | None = None
    prompt_tokens: int | None = None


class PoolStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a pool's or a worker's counters."""

    requests: int
    completed: int
    fallbacks: dict[str, int]
    dropped_stale: int
    rejected_outputs: int
    in_flight: int
    in_flight_peak: int
    waiting: int
    malformed: int
    late_replies: int
    attempts: int = 0  # calls made to backends for the completed requests (a retry is a second one)
    retries: int = 0  # attempts after the first, over the completed requests


def _positive(name: str, value: object, *, allow_float: bool = False) -> None:
    kinds: tuple[type, ...] = (int, float) if allow_float else (int,)
    if isinstance(value, bool) or not isinstance(value, int | float) or not isinstance(value, kinds) or value <= 0:
        raise ConfigError(f"{name} must be a number > 0, got {value!r}")


class PoolConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a pool runs: the backend and its options, the bounds, the transport.

    In-process, the pool runs one worker with `concurrency` slots and at most
    `min(concurrency, max_in_flight)` requests are in flight. With `transport="mqtt"` the
    remote workers bring their own slots and the pool keeps `max_in_flight` outstanding.
    `timeout` bounds one request's time at the backend (seconds); a request's own deadline
    bounds it further. `reply_grace` lets a remote worker's "stale" answer arrive.
    `reconnect` says how long the MQTT transport waits for its broker (sim.mqtt); with
    `run_key`, requests are signed and replies without a valid signature refused (sim.protocol.seal).
    """

    backend: str = "scripted"
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    concurrency: int = 8
    max_in_flight: int = 64
    timeout: float = 30.0
    reply_grace: float = 0.25
    max_line_chars: int = 200
    transport: Transport = "inprocess"
    broker: BrokerAddress = msgspec.field(default_factory=BrokerAddress)
    reconnect: ReconnectPolicy = msgspec.field(default_factory=ReconnectPolicy)
    run_key: RunKey | None = None
    run_id: str = "run"
    shard: str = "0"
    group: str = "workers"

    def __post_init__(self) -> None:
        _positive("concurrency", self.concurrency)
        _positive("max_in_flight", self.max_in_flight)
        _positive("max_line_chars", self.max_line_chars)
        _positive("timeout", self.timeout, allow_float=True)
        if isinstance(self.reply_grace, bool) or not isinstance(self.reply_grace, (int, float)) or self.reply_grace < 0:
            raise ConfigError(f"reply_grace must be a number >= 0, got {self.reply_grace!r}")
        if self.transport not in ("inprocess", "mqtt"):
            raise ConfigError(f"transport must be 'inprocess' or 'mqtt', got {self.transport!r}")

    @property
    def slots(self) -> int:
        """How many requests this pool lets be in flight at once."""
        if self.transport == "inprocess":
            return min(self.concurrency, self.max_in_flight)
        return self.max_in_flight


class WorkerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A remote worker: which run it serves, through which broker, with which backend."""

    broker: BrokerAddress
    run_id: str
    backend: str = "scripted"
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    concurrency: int = 8
    group: str = "workers"
    timeout: float = 30.0
    max_line_chars: int = 200
    name: str = ""
    reconnect: ReconnectPolicy = msgspec.field(default_factory=lambda: ReconnectPolicy(patience=None))
    run_key: RunKey | None = None

    def __post_init__(self) -> None:
        _positive("concurrency", self.concurrency)
        _positive("max_line_chars", self.max_line_chars)
        _positive("timeout", self.timeout, allow_float=True)


_request_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(InferenceRequest)
_result_decoder = msgspec.msgpack.Decoder(InferenceResult)


def encode_request(request: InferenceRequest) -> bytes:
    return _request_encoder.encode(request)


def decode_request(payload: bytes) -> InferenceRequest:
    """Raises msgspec.DecodeError; the transport translates it where the bytes arrive."""
    return _request_decoder.decode(payload)


def encode_result(result: InferenceResult) -> bytes:
    return _request_encoder.encode(result)


def decode_result(payload: bytes) -> InferenceResult:
    return _result_decoder.decode(payload)
