"""What a load test is asked to do (`LoadTestConfig`), and what its phases are given (`Phase`, `Run`).

A run is a series of phases, one per (budget, concurrency) pair (`Phase`); everything the
phases share, from the builder under test to the live display's callback, is one `Run`,
so that the parts that run a phase take that and not a dozen parameters.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import msgspec

from sim.errors import ConfigError
from sim.loadtest._inference import Infer
from sim.loadtest._proposals import OUTPUTS
from sim.loadtest._snapshot import Builder, Checker
from sim.loadtest._stats import PeakRss, Progress
from sim.memory import NpcState, WorkingMemoryConfig

__all__ = ["LoadTestConfig", "Phase", "Run", "default_processes"]


def default_processes() -> int:
    """One sweep process per core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class LoadTestConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One load test. Exactly one of `duration_s` and `requests` ends each phase.

    `requests` counts round trips (or, with `concurrency=0`, snapshots of the sweep).
    `processes=0` turns the sweep off; `concurrency=0` turns the round trip off.
    `concurrency` and `memory` may be tuples: one phase per (memory, concurrency) pair.
    `output` "structured": the round trip's agents propose and players attack them
    (sim.loadtest._proposals).
    """

    agents: int = 1000
    duration_s: float | None = 10.0
    requests: int | None = None
    concurrency: int | tuple[int, ...] = 64
    processes: int = msgspec.field(default_factory=default_processes)
    memory: WorkingMemoryConfig | tuple[WorkingMemoryConfig, ...] = msgspec.field(
        default_factory=WorkingMemoryConfig
    )
    backend: str = "scripted"
    backend_options: dict[str, Any] = msgspec.field(default_factory=dict)
    latency_ms: float = 0.0
    broker: str | None = None
    seed: int = 0
    output: str = "line"

    @property
    def concurrencies(self) -> tuple[int, ...]:
        return (self.concurrency,) if isinstance(self.concurrency, int) else self.concurrency

    @property
    def memories(self) -> tuple[WorkingMemoryConfig, ...]:
        return (self.memory,) if isinstance(self.memory, WorkingMemoryConfig) else self.memory

    @property
    def sizing_chars(self) -> int:
        """The budget the agents are generated against: the smallest, so every budget sees the same agents."""
        return min(m.max_context_chars for m in self.memories)

    def __post_init__(self) -> None:
        if self.agents < 1:
            raise ConfigError(f"agents must be >= 1, got {self.agents!r}")
        if (self.duration_s is None) == (self.requests is None):
            raise ConfigError("give exactly one of duration_s and requests")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ConfigError(f"duration_s must be > 0, got {self.duration_s!r}")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"requests must be >= 1, got {self.requests!r}")
        levels = self.concurrencies
        if not levels or not self.memories:
            raise ConfigError("concurrency and memory must not be empty")
        if min(levels) < 0 or self.processes < 0:
            raise ConfigError(f"concurrency and processes must be >= 0, got {levels}, {self.processes}")
        if len(set(levels)) != len(levels):
            raise ConfigError(f"concurrency: each level once, got {levels}")
        if len(levels) > 1 and 0 in levels:
            raise ConfigError(f"concurrency 0 (sweep only) cannot be part of a list, got {levels}")
        if levels == (0,) and self.processes == 0:
            raise ConfigError("concurrency and processes are both 0: nothing would run")
        if self.output not in OUTPUTS:
            raise ConfigError(f"output must be one of {', '.join(OUTPUTS)}, got {self.output!r}")
        if self.output == "structured" and self.concurrencies == (0,):
            raise ConfigError("output structured needs round trips: concurrency must be >= 1")
        if self.latency_ms < 0:
            raise ConfigError(f"latency_ms must be >= 0, got {self.latency_ms!r}")


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    """One (budget, concurrency) pair of the run, and its place in the series."""

    memory: WorkingMemoryConfig
    concurrency: int
    label: str


class Run(msgspec.Struct, frozen=True, kw_only=True):
    """What every phase of one load test shares.

    `infer` is None when the round trip is off; `states` are the round trip's agents,
    generated once for all phases (the sweep processes generate their own).
    """

    config: LoadTestConfig
    builder: Builder
    checker: Checker
    infer: Infer | None
    states: list[NpcState]
    rss: PeakRss
    on_progress: Callable[[Progress], None] | None
