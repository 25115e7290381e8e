"""Benchmark sim.store: sustained writer throughput, the time to load many agents, storage.

    python benchmarks/bench_store.py [--agents 1000] [--ticks 20] [--rows 10] [--load-agents 10000]
    python benchmarks/bench_store.py --storage DB [DB ...]

1. Writer: `--agents` concurrent agent tasks each add `--rows` rows per tick (half
   episodes, half dialogue lines) for `--ticks` ticks; a driver ends each tick with
   `end_tick`, which commits. Target: >= 50,000 rows/s. The bound measured in the same
   run is raw `sqlite3.executemany` of the same rows, in one thread, one transaction per
   tick, same schema and pragmas: the store cannot beat it, the ratio says what the
   asyncio layer, authority checks, hot-state upkeep and sealing (a MAC per row,
   sim.store.seals: computed before the bound's clock) cost.
2. Load: `--load-agents` agents with `--history` items per flexible category on disk;
   the time for `open_store` + `load_agents(all)` into bounded hot state, against the
   same seven queries run raw in one thread (fetch only, no structs, no seals checked).
3. Storage (`--storage`): for store files written by `npcsim run`,
   the bytes on disk by table (SQLite's `dbstat`) and the bytes per tick, per inference
   and per perceived event (an episode an NPC stored).
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
import msgspec

from sim.memory import Episode, Line, NpcState
from sim.store import HOT_LIMIT, Writer, open_store
from sim.store.records import item, pack_keys, unpack_keys
from sim.store.seals import Sealer
from sim.store.sql import HEARD_RECENT, INSERT, ITEM_BODIES, LOAD_FACTS, LOAD_PROMPTS, LOAD_WORLD, RECENT

_ENCODER = msgspec.msgpack.Encoder()
_SEALER = Sealer()  # a store without a run key: the same cost as with one


def _sealed(table: str, row: tuple[object, ...]) -> tuple[object, ...]:
    """A row with its `mac`, last (INSERT's order for a row whose last value is not a blob)."""
    return (*row, _SEALER.mac(table, row))


def _heard(row: tuple[int, int, bytes]) -> tuple[object, ...]:
    """A heard row with its `mac` before the blob, as INSERT["heard"] takes it."""
    return (*row[:2], _SEALER.mac("heard", row), row[2])

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
    """The bound: the same rows as the store writes them (items, heard rows, dialogue) with
    plain sqlite3 executemany in one thread; encoding and hashing are done before the clock."""
    ids = [f"npc{i}" for i in range(agents)]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.executemany(INSERT["agent_key"], [_sealed("agent_keys", (n + 1, a)) for n, a in enumerate(ids)])
        batches = []
        for tick in range(1, ticks + 1):
            items, heard = [], []
            for n_agent, a in enumerate(ids):
                keys = []
                for n in range(rows // 2):
                    it = item(_ENCODER.encode(Episode(id=f"{tick}.{n}", tick=tick, text=f"{a} saw thing {n}")))
                    items.append((it.key, it.body))
                    keys.append(it.key)
                heard.append(_heard((n_agent + 1, tick, pack_keys(keys))))
            lines = [_sealed("dialogue", (a, tick, n, a, f"line {n} of tick {tick}", "")) for a in ids
                     for n in range(rows // 2)]
            batches.append((items, heard, lines))
        start = time.perf_counter()
        for tick, (items, heard, lines) in enumerate(batches, start=1):
            conn.execute("BEGIN")
            conn.executemany(INSERT["item"], items)
            conn.executemany(INSERT["heard"], heard)
            conn.executemany(INSERT["line"], lines)
            conn.execute("INSERT OR REPLACE INTO meta (key, value, mac) VALUES ('last_tick', ?, ?)",
                         (tick, _SEALER.mac("meta", ("last_tick", tick))))
            conn.execute("COMMIT")
        return time.perf_counter() - start
    finally:
        conn.close()


async def make_schema(path: Path) -> None:
    async with open_store(path):
        pass


def fill_history(path: Path, agents: int, history: int) -> int:
    """Write `agents` agents with `history` items per flexible category, raw, fast.

    Episodes are written as the store writes them: one item each (distinct per agent,
    the worst case for sharing) and one heard row per agent and tick of 10 episodes.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    total = 0
    try:
        conn.execute("BEGIN")
        for i in range(agents):
            a = f"npc{i}"
            conn.execute(INSERT["agent"], _sealed("agents", (a, f"You are {a}.")))
            conn.executemany(INSERT["fact"], [_sealed("facts", (a, f"f{k}", f"fact {k} of {a}", "scenario", 0))
                                              for k in range(3)])
            conn.executemany(INSERT["world"], [_sealed("world", (a, f"w{k}", f"value {k}", "game")) for k in range(2)])
            conn.execute(INSERT["agent_key"], _sealed("agent_keys", (i + 1, a)))
            episodes = [
                item(_ENCODER.encode(Episode(id=f"e{k}", tick=k // 10, text=f"memory {k} of {a}")))
                for k in range(history)
            ]
            conn.executemany(INSERT["item"], [(it.key, it.body) for it in episodes])
            conn.executemany(
                INSERT["heard"],
                [
                    _heard((i + 1, t, pack_keys([it.key for it in episodes[t * 10 : t * 10 + 10]])))
                    for t in range((history + 9) // 10)
                ],
            )
            conn.executemany(INSERT["belief"], [_sealed("beliefs", (a, f"b{k}", k, f"belief {k}", 0.5))
                                                for k in range(history)])
            conn.executemany(INSERT["line"], [_sealed("dialogue", (a, k, 0, "player", f"line {k}", ""))
                                              for k in range(history)])
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
        for sql in (LOAD_PROMPTS, LOAD_FACTS, LOAD_WORLD):
            conn.execute(sql, (ids,)).fetchall()
        for sql in RECENT.values():
            conn.execute(sql, (ids, HOT_LIMIT)).fetchall()
        heard = conn.execute(HEARD_RECENT, (ids, HOT_LIMIT - 1)).fetchall()
        keys = sorted({k for row in heard for k in unpack_keys(row[5])})  # (agent key row, heard row)
        for start_at in range(0, len(keys), 100_000):
            conn.execute(ITEM_BODIES, (json.dumps(keys[start_at : start_at + 100_000]),)).fetchall()
        return time.perf_counter() - start
    finally:
        conn.close()


def storage(path: Path) -> None:
    """Bytes on disk by table and per tick / inference / perceived event."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        size = path.stat().st_size
        tables = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC").fetchall()
        last_tick = int(conn.execute("SELECT value FROM meta WHERE key = 'last_tick'").fetchone()[0])
        (records,) = conn.execute("SELECT count(*) FROM audit").fetchone()
        (perceived,) = conn.execute("SELECT IFNULL(sum(length(items) / 8), 0) FROM heard").fetchone()
    finally:
        conn.close()
    ticks = last_tick + 1
    print(
        f"storage: {path} (schema {version}): {size:,} bytes, {ticks} ticks, {records:,} audit records,"
        f" {perceived:,} perceived events"
    )
    groups = {
        "perception": ("heard", "heard_recent", "agent_keys",
                       "sqlite_autoindex_agent_keys_1"),
        "audit": ("audit", "sqlite_autoindex_audit_1", "audit_agent", "audit_tick"),
        "items (shared by both)": ("items",),
    }  # fmt: skip
    by_name = dict(tables)
    for group, names in groups.items():
        print(f"  {group:24s} {sum(by_name.get(n, 0) for n in names):>14,} bytes")
    other = size - sum(by_name.get(n, 0) for names in groups.values() for n in names)
    print(f"  {'everything else':24s} {other:>14,} bytes")
    print(
        f"  per tick: {size / ticks:,.0f} B; per inference: {size / max(records, 1):,.0f} B (audit part"
        f" {sum(by_name.get(n, 0) for n in groups['audit']) / max(records, 1):,.0f} B);"
        f" per perceived event: {sum(by_name.get(n, 0) for n in groups['perception']) / max(perceived, 1):,.1f} B"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--rows", type=int, default=10, help="rows per agent per tick (even)")
    parser.add_argument("--load-agents", type=int, default=10_000)
    parser.add_argument("--history", type=int, default=100, help="items per flexible category per agent")
    parser.add_argument("--storage", nargs="+", type=Path, default=None, help="only measure these store files")
    args = parser.parse_args()
    print(f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, aiosqlite {aiosqlite.__version__}")
    if args.storage:
        for path in args.storage:
            storage(path)
        return
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
        print(f"  the same seven queries raw, fetch only (bound): {raw_load_s:.2f} s")
        print(f"  ratio to bound: {load_s / raw_load_s:.2f}x the bound's time")


if __name__ == "__main__":
    main()
