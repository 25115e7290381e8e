"""Benchmark sim.store: sustained writer throughput and the time to load many agents.

    python benchmarks/bench_store.py [--agents 1000] [--ticks 20] [--rows 10] [--load-agents 10000]

1. Writer: `--agents` concurrent agent tasks each add `--rows` rows per tick (half
   episodes, half dialogue lines) for `--ticks` ticks; a driver ends each tick with
   `end_tick`, which commits. Target: >= 50,000 rows/s. The bound measured in the same
   run is raw `sqlite3.executemany` of the same rows, in one thread, one transaction per
   tick, same schema and pragmas: the store cannot beat it, the ratio says what the
   asyncio layer, authority checks and hot-state upkeep cost.
2. Load: `--load-agents` agents with `--history` items per flexible category on disk;
   the time for `open_store` + `load_agents(all)` into bounded hot state, against the
   same six queries run raw in one thread (fetch only, no structs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sqlite3
import tempfile
import time
from pathlib import Path

import aiosqlite

from sim.memory import Episode, Line, NpcState
from sim.store import HOT_LIMIT, Writer, open_store
from sim.store._store import _IDS, _RECENT, _SQL

TARGET_ROWS_PER_S = 50_000


async def store_writer(path: Path, agents: int, ticks: int, rows: int) -> float:
    """Seconds for all agents to write all ticks through the store, commits included."""
    ids = [f"npc{i}" for i in range(agents)]
    async with open_store(path) as store:
        for agent_id in ids:
            await store.ensure_agent(NpcState(agent_id=agent_id, system_prompt="p"), writer=Writer.SCENARIO)
        await store.end_tick(0)
        barrier = asyncio.Barrier(agents + 1)

        async def agent(agent_id: str) -> None:
            for tick in range(1, ticks + 1):
                for n in range(rows // 2):
                    episode = Episode(id=f"{tick}.{n}", tick=tick, text=f"{agent_id} saw thing {n}")
                    await store.add_episode(agent_id, episode, writer=Writer.NPC)
                    line = Line(tick=tick, seq=n, speaker=agent_id, text=f"line {n} of tick {tick}")
                    await store.add_line(agent_id, line, writer=Writer.NPC)
                await barrier.wait()  # every agent has queued this tick
                await barrier.wait()  # the tick is committed

        start = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for agent_id in ids:
                tg.create_task(agent(agent_id))
            for tick in range(1, ticks + 1):
                await barrier.wait()
                await store.end_tick(tick)
                await barrier.wait()
        elapsed = time.perf_counter() - start
        stats = store.statistics()
    print(f"  store: {stats.batches} batches, {stats.commits} commits, queue high water {stats.queue_high_water}")
    return elapsed


def raw_writer(path: Path, agents: int, ticks: int, rows: int) -> float:
    """The bound: the same rows with plain sqlite3 executemany, one thread."""
    ids = [f"npc{i}" for i in range(agents)]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        start = time.perf_counter()
        for tick in range(1, ticks + 1):
            episodes = [
                (a, f"{tick}.{n}", tick, f"{a} saw thing {n}", 0.5) for a in ids for n in range(rows // 2)
            ]
            lines = [(a, tick, n, a, f"line {n} of tick {tick}") for a in ids for n in range(rows // 2)]
            conn.execute("BEGIN")
            conn.executemany(_SQL["episode"], episodes)
            conn.executemany(_SQL["line"], lines)
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last_tick', ?)", (tick,))
            conn.execute("COMMIT")
        return time.perf_counter() - start
    finally:
        conn.close()


async def make_schema(path: Path) -> None:
    async with open_store(path):
        pass


def fill_history(path: Path, agents: int, history: int) -> int:
    """Write `agents` agents with `history` items per flexible category, raw, fast."""
    conn = sqlite3.connect(path, isolation_level=None)
    total = 0
    try:
        conn.execute("BEGIN")
        for i in range(agents):
            a = f"npc{i}"
            conn.execute(_SQL["agent"], (a, f"You are {a}."))
            conn.executemany(_SQL["fact"], [(a, f"f{k}", f"fact {k} of {a}", "scenario") for k in range(3)])
            conn.executemany(_SQL["world"], [(a, f"w{k}", f"value {k}", "game") for k in range(2)])
            conn.executemany(_SQL["episode"], [(a, f"e{k}", k, f"memory {k}", 0.5) for k in range(history)])
            conn.executemany(_SQL["belief"], [(a, f"b{k}", k, f"belief {k}", 0.5) for k in range(history)])
            conn.executemany(_SQL["line"], [(a, k, 0, "player", f"line {k}") for k in range(history)])
            total += 5 + 3 * history
        conn.execute("COMMIT")
    finally:
        conn.close()
    return total


async def store_load(path: Path, agents: int) -> float:
    ids = [f"npc{i}" for i in range(agents)]
    start = time.perf_counter()
    async with open_store(path) as store:
        missing = await store.load_agents(ids)
        elapsed = time.perf_counter() - start
        assert not missing and len(store.state(ids[-1]).episodic) == HOT_LIMIT
    return elapsed


def raw_load(path: Path, agents: int) -> float:
    ids = json.dumps([f"npc{i}" for i in range(agents)])
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        start = time.perf_counter()
        for sql in ("SELECT agent, system_prompt FROM agents WHERE ", "SELECT agent, id, text FROM facts WHERE "):
            conn.execute(sql + _IDS, (ids,)).fetchall()
        conn.execute("SELECT agent, key, value FROM world WHERE " + _IDS, (ids,)).fetchall()
        for sql in _RECENT.values():
            conn.execute(sql, (ids, HOT_LIMIT)).fetchall()
        return time.perf_counter() - start
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--rows", type=int, default=10, help="rows per agent per tick (even)")
    parser.add_argument("--load-agents", type=int, default=10_000)
    parser.add_argument("--history", type=int, default=100, help="items per flexible category per agent")
    args = parser.parse_args()
    print(f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, aiosqlite {aiosqlite.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        total = args.agents * args.ticks * (args.rows // 2) * 2
        print(f"writer: {args.agents} agent tasks x {args.ticks} ticks x {args.rows} rows = {total} rows")
        store_s = asyncio.run(store_writer(d / "store.db", args.agents, args.ticks, args.rows))
        asyncio.run(make_schema(d / "raw.db"))
        raw_s = raw_writer(d / "raw.db", args.agents, args.ticks, args.rows)
        store_rate, raw_rate = total / store_s, total / raw_s
        print(f"  store:  {store_rate:10,.0f} rows/s  ({store_s:.2f} s)")
        print(f"  raw sqlite3 executemany (bound): {raw_rate:10,.0f} rows/s  ({raw_s:.2f} s)")
        print(f"  ratio to target {TARGET_ROWS_PER_S:,}: {store_rate / TARGET_ROWS_PER_S:.2f}")
        print(f"  ratio to bound: {store_rate / raw_rate:.2f}")

        asyncio.run(make_schema(d / "load.db"))
        rows = fill_history(d / "load.db", args.load_agents, args.history)
        print(f"load: {args.load_agents} agents, {rows:,} rows on disk, hot limit {HOT_LIMIT} per category")
        load_s = asyncio.run(store_load(d / "load.db", args.load_agents))
        raw_load_s = raw_load(d / "load.db", args.load_agents)
        print(f"  open_store + load_agents: {load_s:.2f} s ({load_s / args.load_agents * 1e6:.0f} us per agent)")
        print(f"  the same six queries raw, fetch only (bound): {raw_load_s:.2f} s")
        print(f"  ratio to bound: {load_s / raw_load_s:.2f}x the bound's time")


if __name__ == "__main__":
    main()
