"""The calm run a faulted schedule must reproduce: one shard, no faults, the same inputs at the same ticks.

Outside input takes effect at the tick it arrived in, which no publisher controls; so the
calm run takes the inputs at the ticks the faulted run recorded them (its stores' `inputs`
tables) and each world-state change at the tick before the first record that knew it,
handed to an in-process `sim.shard.Shard` on the in-memory broker (tests/memory_broker.py)
between its ticks: the same inputs at the same ticks, deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
from collections import defaultdict
from pathlib import Path

from sim.protocol.received import OutsideReceived
from sim.scenario import load_scenario
from sim.shard import RunConfig, RunStats, VirtualClock
from sim.store import open_reader
from sim.wire.events import PlayerInputMessage, WorldStateMessage
from tests.memory_broker import MemoryBroker
from tests.memory_shard import memory_shard

__all__ = ["AuditSet", "RecordedInput", "audit_set", "calm_run", "recorded_inputs", "world_ticks"]

AuditSet = set[tuple[str, tuple[str, ...], str]]
RecordedInput = tuple[int, int, str, str, str]  # tick, seq, player, agent, text


def audit_set(dbs: list[Path]) -> AuditSet:
    """(id, the prompt digest of every attempt, line) of every inference in these stores."""
    records: AuditSet = set()
    for db in dbs:
        with open_reader(db) as reader:
            for r in reader.audit_records():
                attempts = (hashlib.sha256(a.prompt.encode()).hexdigest() for a in r.attempts)
                digests = (r.prompt_sha256, *attempts)
                records.add((r.id, digests, r.line))
    return records


def recorded_inputs(dbs: list[Path]) -> list[RecordedInput]:
    """Every outside input the stores recorded, in (tick, seq) order."""
    rows: list[RecordedInput] = []
    for db in dbs:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            rows += conn.execute("SELECT tick, seq, "
                 "input ->> 'player', input ->> 'to', input ->> 'text' FROM inputs").fetchall()
    return sorted(rows)


def world_ticks(dbs: list[Path], changes: dict[str, str]) -> dict[str, int]:
    """For each world-state key (with its value), the tick shard 0 took it in: the tick before
    the first inference whose NPC knew it (absent: no inference saw it, so no tick changes the audit)."""
    first: dict[str, int] = {}
    for db in dbs:
        with open_reader(db) as reader:
            for r in reader.audit_records():
                for w in r.state.world_state:
                    if changes.get(w.key) == w.value and r.tick - 1 < first.get(w.key, 1 << 30):
                        first[w.key] = r.tick - 1
    return first


async def calm_run(
    scenario: str, run_id: str, until_tick: int, db: Path,
    inputs: list[RecordedInput], world: list[tuple[int, str, str]],
) -> AuditSet:
    """One shard to `until_tick`, taking `inputs` and the world changes (tick, key, value) at their ticks."""
    by_tick: dict[int, list[RecordedInput]] = defaultdict(list)
    for row in inputs:
        by_tick[row[0]].append(row)
    changes: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for tick, key, value in world:
        changes[tick].append((key, value))
    clock = VirtualClock(autojump=0.005)
    broker = MemoryBroker(1, clock)
    config = RunConfig(scenario=scenario, run_id=run_id, until_tick=until_tick)
    stats = RunStats(shard="0")
    loaded = load_scenario(scenario)
    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        async with memory_shard(broker, loaded, config, db, stats, asyncio.Event()) as shard:
            await shard.start()
            for tick in range(until_tick):
                for _, _, player, agent, text in sorted(by_tick.get(tick, [])):
                    said = PlayerInputMessage(to=agent, text=text)
                    shard.source.journal(OutsideReceived("player-input", player, said))
                for key, value in changes.get(tick, []):
                    shard.source.journal(OutsideReceived("world-state", "", WorldStateMessage(state={key: value})))
                assert await shard.step(tick), f"the calm run stopped at tick {tick}"
        server.cancel()
    return audit_set([db])
