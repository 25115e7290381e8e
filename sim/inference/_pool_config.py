"""How a pool and a remote worker run: `PoolConfig` and `WorkerConfig`, checked when built."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

import msgspec

from sim.errors import ConfigError
from sim.mqtt import BrokerAddress, ReconnectPolicy
from sim.protocol.seal import RunKey
from sim.wire import topics
from sim.wire.attempt import MAX_LINE_CHARS, Rules

__all__ = ["PoolConfig", "RunInference", "WorkerConfig"]

Transport = Literal["inprocess", "process", "mqtt"]


def _positive(name: str, value: object, *, allow_float: bool = False) -> None:
    kinds: tuple[type, ...] = (int, float) if allow_float else (int,)
    if isinstance(value, bool) or not isinstance(value, int | float) or not isinstance(value, kinds) or value <= 0:
        raise ConfigError(f"{name} must be a number > 0, got {value!r}")


class RunInference(Protocol):
    """What a run's configuration says about its inferences (sim.shard's InferenceConfig is one).

    A protocol, not the run's configuration itself: sim.inference sits below the shard
    that holds that configuration and never imports it (docs/architecture.md, layers).
    """

    @property
    def backend(self) -> str: ...

    @property
    def backend_options(self) -> Mapping[str, Any]: ...

    @property
    def concurrency(self) -> int: ...

    @property
    def inference_timeout(self) -> float: ...

    @property
    def fact_guard(self) -> str: ...


class PoolConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a pool runs: the backend and its options, the bounds, the transport.

    In-process, the pool runs one worker with `concurrency` slots and at most
    `min(concurrency, max_in_flight)` requests are in flight; with `transport="process"`
    that worker is a child process of the pool's (sim.inference._local), with the same
    bounds. With `transport="mqtt"` the remote workers bring their own slots and the pool
    keeps `max_in_flight` outstanding.
    `timeout` bounds one request's time at the backend (seconds); a request's own deadline
    bounds it further. `reply_grace` lets a remote worker's "stale" answer arrive.
    `reconnect` says how long the MQTT transport waits for its broker (sim.mqtt); with
    `run_key`, requests are signed and replies without a valid signature refused (sim.protocol.seal).
    `fact_guard` names the output check's fact guard as `module:attribute` ("" is the built-in
    one, sim.output.contradicted_fact); remote workers must name the same.
    """

    backend: str = "scripted"
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    concurrency: int = 8
    max_in_flight: int = 64
    timeout: float = 30.0
    reply_grace: float = 0.25
    max_line_chars: int = MAX_LINE_CHARS
    transport: Transport = "inprocess"
    broker: BrokerAddress = msgspec.field(default_factory=BrokerAddress)
    reconnect: ReconnectPolicy = msgspec.field(default_factory=ReconnectPolicy)
    run_key: RunKey | None = None
    run_id: str = "run"
    shard: str = "0"
    group: str = "workers"
    fact_guard: str = ""

    @classmethod
    def from_run(
        cls, run: RunInference, *, transport: Transport = "inprocess", broker: BrokerAddress | None = None,
        run_key: RunKey | None = None, run_id: str = "run", shard: str = "0",
    ) -> PoolConfig:
        """A run's pool: as many requests in flight as its `concurrency`, whatever the transport
        (`transport`, `broker`, `run_key`, `run_id` and `shard` say where they are served)."""
        return cls(
            backend=run.backend, options=dict(run.backend_options), concurrency=run.concurrency,
            max_in_flight=run.concurrency, timeout=run.inference_timeout, fact_guard=run.fact_guard,
            transport=transport, broker=broker or BrokerAddress(), run_key=run_key, run_id=run_id, shard=shard,
        )

    def __post_init__(self) -> None:
        _positive("concurrency", self.concurrency)
        _positive("max_in_flight", self.max_in_flight)
        _positive("max_line_chars", self.max_line_chars)
        _positive("timeout", self.timeout, allow_float=True)
        if isinstance(self.reply_grace, bool) or not isinstance(self.reply_grace, (int, float)) or self.reply_grace < 0:
            raise ConfigError(f"reply_grace must be a number >= 0, got {self.reply_grace!r}")
        if self.transport not in ("inprocess", "process", "mqtt"):
            raise ConfigError(f"transport must be 'inprocess', 'process' or 'mqtt', got {self.transport!r}")

    @property
    def rules(self) -> Rules:
        """The rules its replies are judged under (each request adds its NPC's output policy)."""
        return Rules(max_line_chars=self.max_line_chars, fact_guard=self.fact_guard)

    @property
    def slots(self) -> int:
        """How many requests this pool lets be in flight at once."""
        if self.transport != "mqtt":
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
    max_line_chars: int = MAX_LINE_CHARS
    name: str = ""
    reconnect: ReconnectPolicy = msgspec.field(default_factory=lambda: ReconnectPolicy(patience=None))
    run_key: RunKey | None = None
    fact_guard: str = ""  # as PoolConfig.fact_guard: the same as the run's pool

    def __post_init__(self) -> None:
        _positive("concurrency", self.concurrency)
        _positive("max_line_chars", self.max_line_chars)
        _positive("timeout", self.timeout, allow_float=True)
        if self.name:
            try:
                topics.check_segment("worker name", self.name)
            except ValueError as exc:
                raise ConfigError(f"--name: {exc}") from None

    @property
    def rules(self) -> Rules:
        """The rules its replies are judged under, as PoolConfig's: the same as the run's pool."""
        return Rules(max_line_chars=self.max_line_chars, fact_guard=self.fact_guard)
