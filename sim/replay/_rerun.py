"""Executing a recorded run again, in this process, from tick 0: `execute`.

The run's shards become one (layout 0/1: a run is a function of its scenario, seed and
inputs whatever its layout, tests/test_same_run.py) on a `LocalBroker` (no Mosquitto), the
scenario parsed from the bytes the run read, with the working-memory config it ran with.
The shard takes the recorded outside inputs and world-state changes at their ticks
(`RecordedInputs`) and the pool answers every inference with the replies recorded for it
(sim.inference's `recorded`: each attempt in order, retries and fallbacks included), so
nothing but the engine decides what happens; everything is written to a new store, to be
compared with the original (sim.replay._compare). Under `tokenizer = "server"` the prompts
are counted with the counts the records kept (`KeptCounts`): no server is asked.

A fork (`fork_at`) answers from the record only the inferences of the ticks before it;
from that tick on the backend given answers, live.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from sim.audit import AuditRecord
from sim.errors import ConfigError, InferenceError
from sim.inference import InferenceRequest, KeptCounts, Reply
from sim.memory import WorkingMemory, WorkingMemoryConfig
from sim.mqtt import LocalBroker
from sim.replay._recording import Recording
from sim.scenario import Scenario, parse_scenario
from sim.shard import (
    Connection,
    InferenceConfig,
    MemoryConfigOf,
    RecordConfig,
    RunConfig,
    RunStats,
    Seams,
    ShardPlan,
    open_shard,
)
from sim.store import RunSettings, Store

__all__ = ["Executed", "execute"]

Progress = Callable[[int, int], None]
"""Told (tick done, ticks in all) about once a second."""


class Executed(msgspec.Struct, frozen=True, kw_only=True):
    """A re-execution: its store, ticks 0 to `end - 1`, its counters and how long it took
    (`seconds` in all, `tick_seconds` in its ticks, start-up left out)."""

    out: Path
    end: int
    seconds: float
    tick_seconds: float
    inferences: int
    fallbacks: int
    over_budget: int


class _Unrecorded:
    """The backend of a re-execution for what the record does not answer: an inference the run
    did not make fails, and the fallback speaks (the comparison names it)."""

    name = "recorded"
    model = "recorded"
    prompt_form = "text"
    prompt_prefix = ""

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None) -> Reply:
        raise InferenceError("the recorded run made no such inference")


async def execute(
    recording: Recording,
    out: Path,
    *,
    until_tick: int | None = None,
    fork_at: int | None = None,
    backend: str = "scripted",
    backend_options: dict[str, Any] | None = None,
    alter: Callable[[Scenario], Scenario] | None = None,
    fork_memory: Callable[[WorkingMemoryConfig, str], WorkingMemoryConfig] | None = None,
    progress: Progress | None = None,
) -> Executed:
    """Execute `recording` again into the new store `out`, to `until_tick` (default: its end).

    `fork_at`: answer from the record only before that tick, then with `backend`;
    `fork_memory(recorded, npc)`: from that tick on, each NPC's working-memory config.
    `alter` changes the scenario before it runs (a test's hook: another NPC's dice).
    """
    end = recording.last_tick + 1 if until_tick is None else until_tick
    if not 1 <= end <= recording.last_tick + 1:
        raise ConfigError(f"--until-tick {until_tick}: the run holds ticks 0 to {recording.last_tick}")
    if fork_at is not None and not 0 <= fork_at < end:
        raise ConfigError(f"--fork-at {fork_at}: must be a tick of the run before {end}")
    if fork_memory is not None and fork_at is None:
        raise ConfigError("a working memory changed from a tick on needs --fork-at T")
    _check_new(out)
    identity, settings = recording.identity, recording.settings
    scenario = parse_scenario(recording.scenario, source=f"the scenario of {recording.paths[0]}")
    scenario = msgspec.structs.replace(scenario, memory=settings.memory)
    if alter is not None:
        scenario = alter(scenario)
    live = fork_at is not None
    inference = InferenceConfig(
        backend=backend if live else settings.backend, backend_options=dict(backend_options or {}) if live else {},
        placement="in-process",  # the pool answers from the record, in this process
        inference_timeout=settings.inference_timeout, fact_guard=settings.fact_guard,
    )
    config = RunConfig(
        scenario=str(recording.paths[0]), run_id=identity.run_id, seed=identity.seed, until_tick=end,
        bots=settings.bots, bot_rate=settings.bot_rate, inference=inference,
        record=RecordConfig(db=str(out), retain_memories=settings.retain_memories),
    )
    records = recording.records
    limit = end if fork_at is None else fork_at

    def recorded(request: InferenceRequest) -> AuditRecord | None:
        record = records.get(request.id)
        return record if record is not None and record.tick < limit else None

    stats, stop = RunStats(), asyncio.Event()
    started = time.perf_counter()
    broker = LocalBroker()
    claim = msgspec.structs.replace(
        identity, shard="0/1", nonce=secrets.token_hex(16),
        settings=msgspec.structs.replace(settings, end_tick=end, backend=inference.backend,
                                         backend_options=inference.backend_options,
                                         model=RunSettings.model_named(inference.backend_options), tick_ms=0)
        if live else msgspec.structs.replace(settings, end_tick=end, tick_ms=0),
    )

    async def keep_identity(store: Store) -> None:
        await store.keep_identity(claim, recording.scenario)

    plan = ShardPlan(config, scenario, run_id=identity.run_id, seed=identity.seed)
    seams = Seams(backend=None if live else _Unrecorded(), recorded=recorded, inputs=recording.inputs,
                  memory_config_of=_forked_memory(scenario.memory, fork_at, fork_memory),
                  tokenizer=KeptCounts({text: n for record in records.values() for text, n in record.counts.items()}))
    async with open_shard(
        plan, out, stats=stats, stop=stop, connection=Connection(transport=broker.transport()), claim=keep_identity,
        seams=seams,
    ) as shard:
        await shard.start()
        ticking = time.perf_counter()
        async with _reporting(progress, stats, end):
            await shard.run(until=end)
        ticked = time.perf_counter() - ticking
        await shard.go_offline()
    return Executed(out=out, end=end, seconds=time.perf_counter() - started, tick_seconds=ticked,
                    inferences=stats.inferences,
                    fallbacks=stats.fallbacks, over_budget=stats.over_budget)


def _forked_memory(
    recorded: WorkingMemoryConfig, fork_at: int | None,
    fork_memory: Callable[[WorkingMemoryConfig, str], WorkingMemoryConfig] | None,
) -> MemoryConfigOf | None:
    """Each NPC's working-memory config: the recorded one, and `fork_memory`'s from `fork_at` on."""
    if fork_at is None or fork_memory is None:
        return None
    at = fork_at

    def config_of(npc: str, tick: int) -> WorkingMemoryConfig:
        return fork_memory(recorded, npc) if tick >= at else recorded

    return config_of


def _check_new(out: Path) -> None:
    """A re-execution writes a new store: an existing one is never added to."""
    if out.exists() and out.stat().st_size > 0:
        raise ConfigError(f"--out {out}: the file exists; give a new one")


@contextlib.asynccontextmanager
async def _reporting(progress: Progress | None, stats: RunStats, end: int) -> AsyncIterator[None]:
    """Tell `progress` the tick reached about once a second while the block runs."""
    if progress is None:
        yield
        return

    async def report() -> None:
        while True:
            await asyncio.sleep(1.0)
            progress(stats.tick, end)

    task = asyncio.create_task(report(), name="replay-progress")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
