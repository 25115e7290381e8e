"""A run's configuration and what follows from it alone: shards, their NPCs, the hot window.

`RunConfig` is the library's boundary and the declaration of a run's settings: the CLI's
daily flags and `--set KEY=VALUE` (sim.settings: KEY a dotted path into it, `memory.KEY` into
the scenario's `WorkingMemoryConfig`) both read it, and a bad value is refused here, named.
The checks that need the store or the scenario (`check_resumable`,
`check_retention`) run before anything starts, so a refused run leaves no file behind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import msgspec

from sim.errors import ConfigError
from sim.memory import WorkingMemoryConfig
from sim.mqtt import TlsFiles
from sim.protocol.bounds import InputBounds
from sim.scenario import NpcSpec, Scenario
from sim.settings import check_settings, with_settings
from sim.shard._place_shares import assign_places
from sim.store import HOT_LIMIT, Store, open_reader

__all__ = [
    "MAX_SHARDS",
    "WORKER_PROCESS_NPCS",
    "BrokerConfig",
    "InferenceConfig",
    "Limits",
    "Placement",
    "RecordConfig",
    "RunConfig",
    "check_resumable",
    "check_resume",
    "check_shards",
    "check_retention",
    "default_run_id",
    "hot_limit",
    "memory_config",
    "parse_shard",
    "pool_transport",
    "shard_npcs",
    "with_servers",
]


MAX_SHARDS = 1024
"""Shards of one run at most: each holds every other's barrier state, so the count is bounded
(a count of millions would exhaust memory before it could say anything)."""


Placement = Literal["auto", "in-process", "process", "remote"]
"""Where a shard's inferences are served: on its event loop ("in-process"), in a worker process
of its own ("process"), by remote workers through the broker ("remote", `npcsim worker`), or
"auto": a worker process when the shard holds WORKER_PROCESS_NPCS NPCs or more and the machine
has a second CPU for it, in-process otherwise."""

WORKER_PROCESS_NPCS = 1_000
"""A shard holding this many NPCs serves its inferences in a worker process by default (when the
machine has a second CPU): below it, a run's turns are too few to pay for the process's start."""


def _check_whole(part: msgspec.Struct, minimum: dict[str, int], where: str) -> None:
    """Whole numbers >= their minimum; `where` is the part's key (`inference.`), "--" for the
    run's own fields, which have flags."""
    for name, low in minimum.items():
        value = getattr(part, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ConfigError(f"{_named(where, name)} must be a whole number >= {low}, got {value!r}")


def _check_seconds(part: msgspec.Struct, names: tuple[str, ...], where: str) -> None:
    for name in names:
        value = getattr(part, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
            raise ConfigError(f"{_named(where, name)} must be a number of seconds > 0, got {value!r}")


def _named(where: str, name: str) -> str:
    return f"--{name.replace('_', '-')}" if where == "--" else f"{where}{name}"


class BrokerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where the run's messages go: the broker's URL ("auto": one npcsim starts), its TLS files,
    the file of the run key that seals what the shards tell each other, and the WebSocket
    port of a broker npcsim starts (None: a free one)."""

    url: str = "auto"
    tls: TlsFiles = msgspec.field(default_factory=TlsFiles)
    run_key_file: str | None = None
    ws_port: int | None = None

    def __post_init__(self) -> None:
        _check_whole(self, {"ws_port": 1}, "broker.")
        if self.ws_port is not None and self.ws_port > 65535:
            raise ConfigError(f"broker.ws_port must be a port number 1-65535, got {self.ws_port}")


class InferenceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Which backend answers, where (`placement`), how many at once, and how long one may take.

    Its field names are those sim.inference's `PoolConfig.from_run` reads (`RunInference`).
    `fact_guard` is the output check's fact guard, `module:attribute` ("": the built-in one).
    """

    backend: str = "scripted"
    backend_options: dict[str, Any] = msgspec.field(default_factory=dict)
    placement: Placement = "auto"
    concurrency: int = 64
    inference_timeout: float = 30.0
    fact_guard: str = ""

    def __post_init__(self) -> None:
        _check_whole(self, {"concurrency": 1}, "inference.")
        _check_seconds(self, ("inference_timeout",), "inference.")
        if self.placement not in get_args(Placement):
            raise ConfigError(f"inference.placement must be one of {get_args(Placement)}, got {self.placement!r}")


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The run's bounds: on outside input, and on a barrier's wait before it is logged as a stall."""

    bounds: InputBounds = msgspec.field(default_factory=InputBounds)
    echo_timeout: float = 5.0

    def __post_init__(self) -> None:
        _check_seconds(self, ("echo_timeout",), "limits.")


class RecordConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What the run keeps and tells: its store (`db`), whether it continues the store's run,
    how many memories of each category each agent keeps (None: all), whether the dialogue is
    kept for printing, and whether the trace carries each prompt.

    Without `db` the store goes in the folder `runs_dir` (sim.store.new_store; `--resume`
    continues the newest of the run there), which keeps the newest `runs_kept` stores; with
    neither, in a temporary file, gone with the run.
    """

    db: str | None = None
    resume: bool = False
    retain_memories: int | None = None
    keep_dialogue: bool = False
    trace_prompts: bool = True
    runs_dir: str | None = None
    runs_kept: int = 10

    def __post_init__(self) -> None:
        _check_whole(self, {"retain_memories": 1, "runs_kept": 1}, "record.")


class RunConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What runs (the scenario, this shard of it, the seed, the ticks, the bots) and its parts:
    the broker, the inference, the limits and what is recorded; `memory` is the run's changes to
    the scenario's [memory] table, by dotted key (`{"selection": "scored"}`: `memory_config`)."""

    scenario: str
    shard: str = "0/1"
    seed: int | None = None
    run_id: str | None = None
    ticks: int | None = None
    until_tick: int | None = None  # run up to and including tick until_tick - 1 (not with `ticks`)
    tick_ms: int = 0
    bots: int = 0
    bot_rate: float = 0.1
    broker: BrokerConfig = msgspec.field(default_factory=BrokerConfig)
    inference: InferenceConfig = msgspec.field(default_factory=InferenceConfig)
    limits: Limits = msgspec.field(default_factory=Limits)
    record: RecordConfig = msgspec.field(default_factory=RecordConfig)
    memory: dict[str, Any] = {}

    def __post_init__(self) -> None:
        """The library's boundary: the same values the CLI refuses are refused here, named."""
        _check_whole(self, {"ticks": 1, "until_tick": 1, "tick_ms": 0, "bots": 0}, "--")
        check_settings(WorkingMemoryConfig, self.memory, "memory.")
        if self.ticks is not None and self.until_tick is not None:
            raise ConfigError(f"--ticks {self.ticks} and --until-tick {self.until_tick}: give one of them, not both")
        parse_shard(self.shard)


def pool_transport(config: RunConfig, npcs: int) -> Literal["inprocess", "process", "mqtt"]:
    """Where a shard of `npcs` NPCs has its inferences served (`PoolConfig.transport`)."""
    placement = config.inference.placement
    if placement == "remote":
        return "mqtt"
    if placement == "auto":
        placement = "process" if npcs >= WORKER_PROCESS_NPCS and len(os.sched_getaffinity(0)) > 1 else "in-process"
    return "process" if placement == "process" else "inprocess"


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


def shard_npcs(scenario: Scenario, index: int, count: int, owner: Mapping[str, int] | None = None) -> list[NpcSpec]:
    """Shard i of n's NPCs, in id order: those standing at the places it holds.

    A shard holds whole places (sim.shard._place_shares: balanced by NPC count, a function of the
    scenario and n only), so that everyone who hears a line at a place is on the same shard.
    """
    owner = owner if owner is not None else assign_places(scenario, count)
    return sorted((spec for spec in scenario.npcs if owner[spec.location] == index), key=lambda s: s.id)


def memory_config(config: RunConfig, scenario: Scenario) -> WorkingMemoryConfig:
    """The scenario's working-memory config with the run's changes (`--set memory.KEY=VALUE`,
    `--stable-prefix`); a combination the config refuses is a ConfigError naming them."""
    return with_settings(scenario.memory, config.memory, "memory.")


def with_servers(config: RunConfig, scenario: Scenario) -> RunConfig:
    """The run with the scenario's `[inference] servers` as the `openai` backend's `base_url`,
    when the run names none (`--base-url` wins)."""
    inference = config.inference
    servers = scenario.inference.servers
    if inference.backend != "openai" or "base_url" in inference.backend_options or not servers:
        return config
    options = {**inference.backend_options, "base_url": list(servers)}
    return msgspec.structs.replace(config, inference=msgspec.structs.replace(inference, backend_options=options))


def hot_limit(config: WorkingMemoryConfig) -> int:
    """The store's hot state holds at least what the count caps can use, in every category."""
    return max(HOT_LIMIT, config.max_dialogue_lines, config.max_episodic_memories, config.max_beliefs)


def default_run_id(scenario: Scenario, seed: int) -> str:
    return f"{scenario.scenario.name}-{seed}"


def check_resumable(config: RunConfig) -> None:
    """`--resume` continues a store file that holds a committed tick; read (never written)
    before anything opens, so that a refused resume creates no file."""
    if not config.record.resume or not config.record.db:
        return
    db = Path(config.record.db)
    if not db.is_file():
        raise ConfigError(f"--resume: {db}: no such file (without --resume the run starts it)")
    with open_reader(db) as reader:
        if reader.last_tick() is None:
            raise _nothing_to_resume(db)


def _nothing_to_resume(db: Path) -> ConfigError:
    return ConfigError(f"--resume: {db} holds no committed tick to continue from")


def check_resume(config: RunConfig, db: Path, store: Store) -> None:
    """A database holding ticks is continued only when asked, never silently reused; the
    other half, a resume of what holds no tick, is `check_resumable`'s."""
    if config.record.resume and store.last_tick is None:  # replaced since check_resumable read it
        raise _nothing_to_resume(db)
    if not config.record.resume and store.last_tick is not None:
        raise ConfigError(
            f"--db {db} already holds this run up to tick {store.last_tick}: "
            "pass --resume to continue it, or give another file"
        )


def check_retention(config: RunConfig, limit: int) -> None:
    """Retention never reaches into what a working memory can use (sim/store/_retention.py);
    checked before anything starts, so a refused run leaves no file behind."""
    retain = config.record.retain_memories
    if retain is not None and retain < limit:
        raise ConfigError(
            f"record.retain_memories must be at least the store's hot window ({limit} items per category),"
            f" got {retain}"
        )
