"""A run's configuration and what follows from it alone: shards, their NPCs, the hot window.

`RunConfig` is the library's boundary: the values the CLI refuses are refused here too, by
option name. The checks that need the store or the scenario (`check_resume`,
`check_retention`) run before anything starts, so a refused run leaves no file behind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import msgspec

from sim.errors import ConfigError
from sim.memory import WorkingMemoryConfig
from sim.mqtt import TlsFiles
from sim.protocol.bounds import InputBounds
from sim.scenario import NpcSpec, Scenario
from sim.shard._places import assign_places
from sim.store import HOT_LIMIT, Store

__all__ = [
    "MAX_SHARDS",
    "WORKER_PROCESS_NPCS",
    "RunConfig",
    "check_resume",
    "check_shards",
    "check_retention",
    "default_run_id",
    "hot_limit",
    "memory_config",
    "parse_shard",
    "pool_transport",
    "shard_npcs",
]


MAX_SHARDS = 1024
"""Shards of one run at most: each holds every other's barrier state, so the count is bounded
(`--shard 0/100000000` took 15.7 GB before it could say anything)."""


class RunConfig(msgspec.Struct, frozen=True, kw_only=True):
    scenario: str
    broker: str = "auto"
    broker_tls: TlsFiles = msgspec.field(default_factory=TlsFiles)
    bounds: InputBounds = msgspec.field(default_factory=InputBounds)
    run_key_file: str | None = None
    ticks: int | None = None
    until_tick: int | None = None  # run up to and including tick until_tick - 1 (not with `ticks`)
    tick_ms: int = 0
    seed: int | None = None
    run_id: str | None = None
    db: str | None = None
    backend: str = "scripted"
    backend_options: dict[str, Any] = msgspec.field(default_factory=dict)
    remote_workers: bool = False
    # serve inferences in a worker process of the shard's (None: when it holds >= WORKER_PROCESS_NPCS NPCs
    # and the machine has a second CPU for it)
    inference_process: bool | None = None
    shard: str = "0/1"
    resume: bool = False
    concurrency: int = 64
    bots: int = 0
    bot_rate: float = 0.1
    echo_timeout: float = 5.0  # a barrier held longer than this is logged as a stall
    shutdown_timeout: float = 10.0
    inference_timeout: float = 30.0
    keep_dialogue: bool = False
    trace_prompts: bool = True  # the trace topic carries each prompt (off: report and digest only)
    retain_memories: int | None = None  # prune memories past each agent's newest N per category; None keeps all
    max_context_chars: int | None = None  # overrides the scenario's [memory] limit for this run (memory_config)
    max_context_tokens: int | None = None  # likewise, a limit in tokens
    fact_guard: str = ""  # the output check's fact guard, `module:attribute` ("": the built-in one)

    def __post_init__(self) -> None:
        """The library's boundary: the same values the CLI refuses are refused here, by option name."""
        minimum = {"ticks": 1, "until_tick": 1, "tick_ms": 0, "concurrency": 1, "bots": 0, "retain_memories": 1,
                   "max_context_chars": 1, "max_context_tokens": 1}
        for name, low in minimum.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"--{name.replace('_', '-')} must be a whole number >= {low}, got {value!r}")
        for name in ("inference_timeout", "echo_timeout", "shutdown_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise ConfigError(f"--{name.replace('_', '-')} must be a number of seconds > 0, got {value!r}")
        if self.remote_workers and self.inference_process:
            raise ConfigError("--remote-workers and --inference-process: inferences go to one or the other")
        if self.ticks is not None and self.until_tick is not None:
            raise ConfigError(f"--ticks {self.ticks} and --until-tick {self.until_tick}: give one of them, not both")
        parse_shard(self.shard)


WORKER_PROCESS_NPCS = 1_000
"""A shard holding this many NPCs serves its inferences in a worker process by default (when the
machine has a second CPU): below it, a run's turns are too few to pay for the process's start."""


def pool_transport(config: RunConfig, npcs: int) -> Literal["inprocess", "process", "mqtt"]:
    """Where a shard of `npcs` NPCs has its inferences served (`PoolConfig.transport`)."""
    if config.remote_workers:
        return "mqtt"
    wanted = config.inference_process
    if wanted is None:
        wanted = npcs >= WORKER_PROCESS_NPCS and len(os.sched_getaffinity(0)) > 1
    return "process" if wanted else "inprocess"


def parse_shard(value: str) -> tuple[int, int]:
    """`i/n` with 0 <= i < n <= MAX_SHARDS."""
    shown = repr(value if len(value) <= 40 else value[:40] + "...")
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError as exc:
        raise ConfigError(f"--shard {shown}: expected i/n, for example 0/2") from exc
    if not 0 <= index < count:
        raise ConfigError(f"--shard {shown}: need 0 <= i < n")
    if count > MAX_SHARDS:
        many = f"{count} shards; " if len(value) <= 40 else ""
        raise ConfigError(f"--shard {shown}: {many}a run has at most {MAX_SHARDS}")
    return index, count


def check_shards(config: RunConfig, scenario: Scenario) -> None:
    """No more shards than NPCs: a shard without an NPC would only hold the barrier."""
    _, count = parse_shard(config.shard)
    if count > max(len(scenario.npcs), 1):
        raise ConfigError(
            f"--shard {config.shard}: {count} shards for {len(scenario.npcs)} NPCs; at most one shard per NPC"
        )


def shard_npcs(scenario: Scenario, index: int, count: int) -> list[NpcSpec]:
    """Shard i of n's NPCs, in id order: those standing at the places it holds.

    Since issue 20 a shard holds whole places (sim.shard._places: balanced by NPC count, a
    function of the scenario and n only), no longer every n-th NPC by id, so that everyone
    who hears a line at a place is on the same shard.
    """
    owner = assign_places(scenario, count)
    return sorted((spec for spec in scenario.npcs if owner[spec.location] == index), key=lambda s: s.id)


def memory_config(config: RunConfig, scenario: Scenario) -> WorkingMemoryConfig:
    """The scenario's working-memory config with the run's overrides (`--max-context-chars`,
    `--max-context-tokens`); a combination the config refuses is a ConfigError naming it."""
    overrides = {name: value for name in ("max_context_chars", "max_context_tokens")
                 if (value := getattr(config, name)) is not None}
    return msgspec.structs.replace(scenario.memory, **overrides) if overrides else scenario.memory


def hot_limit(config: WorkingMemoryConfig) -> int:
    """The store's hot state holds at least what the count caps can use, in every category."""
    return max(HOT_LIMIT, config.max_dialogue_lines, config.max_episodic_memories, config.max_beliefs)


def default_run_id(scenario: Scenario, seed: int) -> str:
    return f"{scenario.scenario.name}-{seed}"


def check_resume(config: RunConfig, db: Path, store: Store) -> None:
    """A database holding ticks is continued only when asked, never silently reused."""
    if config.resume and store.last_tick is None:
        raise ConfigError(f"--resume: {db} holds no committed tick to continue from")
    if not config.resume and store.last_tick is not None:
        raise ConfigError(
            f"--db {db} already holds this run up to tick {store.last_tick}: "
            "pass --resume to continue it, or give another file"
        )


def check_retention(config: RunConfig, limit: int) -> None:
    """Retention never reaches into what a working memory can use (sim/store/_retention.py);
    checked before anything starts, so a refused run leaves no file behind."""
    if config.retain_memories is not None and config.retain_memories < limit:
        raise ConfigError(
            f"--retain-memories must be at least the store's hot window ({limit} items per category),"
            f" got {config.retain_memories}"
        )
