"""The engine at scale (issue 20): a generated world on one shard, against a floor measured in the same run.

For each world (10k: `--npcs 10000 --locations 100`, 100k: `--npcs 100000 --locations 1000`)
the engine runs N ticks on one shard (scripted backend, `--broker auto`, a real store
file) and the report gives ticks/s, the barrier wait per tick, RSS per NPC, and the
engine's time per inference and per perceived event (one event at a place times the NPCs
there: the work the engine before issue 20 did, one episode per listener). The **floor**
is measured on the same ticks: the essential work of each tick in a tight loop with no
broker, from the audit records the run wrote: build each speaker's working memory from its
state, encode its inference request, pack its audit record as the store keeps it, and
write the tick's rows with one `executemany` per table (one transaction). It runs on the
engine's footing: in a process of its own, so that no rendering the run remembered is
reused, with what it loaded frozen and the tick-time collector, as the engine runs its
ticks (`PausedCollector`). The engine's time per tick is then given against the floor's;
the floor with each record as plain msgpack (the first definition) is given beside it.

Then the bytes each shard takes in, from the broker and delivered locally, with 1, 2 and 4
shards of the 100k world (all shards in one process, on one private Mosquitto, a few
ticks): a shard holds whole places, so what it takes in shrinks with the shard count.
Locally delivered events are never encoded; their bytes are given as the events' msgpack
size as the shard stored them in its places' logs.

    .venv/bin/python benchmarks/bench_engine.py                          # both worlds, the bytes
    .venv/bin/python benchmarks/bench_engine.py --worlds 10k --no-bytes  # quick, to steer
    .venv/bin/python benchmarks/bench_engine.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/bench_engine.py --scenario k10.toml --ticks 20 --serving inprocess  # one run

With `--repeats N` each world runs N times (and, with `--in-process-too`, N times serving in
the shard's own process, alternating with the first ones), and the report gives the median
run and the range: one run of the 10k world varies by a fifth on this machine.

Each measurement (engine, each floor, each bytes run) runs in a child process of its own, so
RSS and peak RSS are its alone.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

if __package__ in (None, ""):  # run as a script: the repository is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import machine_line, write_section
from sim.audit import AuditRecord, encode_record
from sim.broker import open_broker
from sim.generate import write_scenario
from sim.inference import InferenceRequest
from sim.memory import build_working_memory
from sim.mqtt import ENV_PASSWORD, ENV_USERNAME
from sim.shard import (
    BrokerConfig,
    InferenceConfig,
    PausedCollector,
    Placement,
    RecordConfig,
    RunConfig,
    RunStarted,
    RunStats,
    run,
)
from sim.store import open_reader
from sim.store.records import RecordPacker, unpack_keys
from sim.wire.inference import encode_request

HEADING = "The engine at scale"
SERVING = {"auto": "the default, a worker process from 1,000 NPCs", "process": "a worker process",
           "inprocess": "in the shard's process"}
PLACEMENT: dict[str, Placement] = {"auto": "auto", "process": "process", "inprocess": "in-process"}
WORLDS = {"10k": (10_000, 100, 20), "100k": (100_000, 1_000, 5)}  # NPCs, locations, ticks
TARGETS = {
    "ticks/s 10k": 4.0, "ticks/s 100k": 0.5, "barrier ms": 50.0, "KB per NPC 100k": 5.0, "floor ratio": 4.0,
    "bytes ratio": 0.35,
}
_AUDIT_ROW = "INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_ITEM_ROW = "INSERT OR IGNORE INTO items VALUES (?, ?)"


# --- one world on one shard, and its floor ---------------------------------------------------


async def engine_run(scenario: Path, ticks: int, db: Path, *, serving: str = "auto") -> dict[str, Any]:
    """One run of `scenario` on one shard: its figures, the ticks' time and CPU apart from start-up."""
    process = psutil.Process()
    gc.collect()
    rss_before = process.memory_info().rss
    marks: dict[str, float] = {"started": time.perf_counter()}

    def children_cpu() -> float:
        """The CPU of the children that ended (the worker process and Mosquitto end with the run)."""
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def ready(_: RunStarted) -> None:
        marks.update(ready=time.perf_counter(), rss_ready=process.memory_info().rss, cpu=time.process_time(),
                     children_cpu=children_cpu())

    config = RunConfig(
        scenario=str(scenario), ticks=ticks, run_id="bench", broker=BrokerConfig(url="auto"),
        inference=InferenceConfig(placement=PLACEMENT[serving]),
        record=RecordConfig(db=str(db)),
    )
    stats = await run(config, on_ready=ready)
    run_s = time.perf_counter() - marks["ready"]
    assert stats.bus is not None
    return {
        "npcs": stats.agents, "ticks": stats.ticks_done, "startup_s": marks["ready"] - marks["started"],
        "run_s": run_s, "cpu_s": time.process_time() - marks["cpu"],
        "children_cpu_s": children_cpu() - marks["children_cpu"], "serving": serving,
        "inferences": stats.inferences, "moves": stats.npc_moves, "per_npc_tick": stats.inferences_per_npc_tick,
        "perceived": stats.bus.events_delivered,
        "barrier_ms": 1000 * stats.barrier_seconds / max(stats.barrier_ticks, 1),
        "rss_per_npc": (marks["rss_ready"] - rss_before) / max(stats.agents, 1),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load": os.getloadavg()[0],
    }


def floor(db: Path, *, packed: bool = True) -> float:
    """The essential work of the run's ticks, from its audit records, in a tight loop: seconds.

    On the engine's footing: in a process of its own, so nothing the run rendered is
    remembered; the records loaded as start-up loads a world, then frozen, with the
    tick-time collector (`PausedCollector`, as the engine runs); each record packed as the
    store keeps it (`RecordPacker`: its items and its blob), the tick's rows written with
    one `executemany` per table in one transaction. `packed=False`: each record as plain
    msgpack instead (`encode_record`, one row), the floor as first defined.
    """
    with PausedCollector() as collector:
        with open_reader(db) as reader:
            records = list(reader.audit_records())
        by_tick: dict[int, list[AuditRecord]] = defaultdict(list)
        for record in records:
            by_tick[record.tick].append(record)
        collector.start_up_done()
        with tempfile.TemporaryDirectory() as tmp:
            conn = sqlite3.connect(Path(tmp) / "floor.db", isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("CREATE TABLE items (k INTEGER PRIMARY KEY, body BLOB)")
            conn.execute("CREATE TABLE audit (id TEXT PRIMARY KEY, run_id TEXT, agent TEXT, tick INTEGER,"
                         " backend TEXT, model TEXT, fallback INTEGER, line TEXT, record BLOB)")
            packer = RecordPacker()
            started = time.perf_counter()
            for tick in sorted(by_tick):
                rows, items = [], []
                for r in by_tick[tick]:
                    memory = build_working_memory(r.state, r.player_input, r.config)
                    request = InferenceRequest(id=r.id, run_id=r.run_id, agent_id=r.agent_id, tick=r.tick,
                                               memory=memory, deadline=0.0, state=r.state, config=r.config)
                    encode_request(request)
                    if packed:
                        blob, fresh = packer.pack(r)
                        items += [(i.key, i.body) for i in fresh]
                    else:
                        blob = encode_record(r)
                    rows.append((r.id, r.run_id, r.agent_id, r.tick, r.backend, r.model, r.fallback, r.line, blob))
                conn.execute("BEGIN")
                conn.executemany(_ITEM_ROW, items)
                conn.executemany(_AUDIT_ROW, rows)
                conn.execute("COMMIT")
            elapsed = time.perf_counter() - started
            conn.close()
    return elapsed


# --- bytes taken in per shard, with n shards ---------------------------------------------------


async def bytes_run(npcs: int, locations: int, ticks: int, shards: int, tmp: Path) -> dict[str, Any]:
    scenario = write_scenario(tmp / "world.toml", npcs=npcs, locations=locations, seed=1)
    async with open_broker("auto") as broker:
        os.environ[ENV_USERNAME] = broker.address.username or ""
        os.environ[ENV_PASSWORD] = broker.address.password or ""
        configs = [RunConfig(
            scenario=str(scenario), ticks=ticks, run_id="bytes", shard=f"{i}/{shards}",
            broker=BrokerConfig(url=broker.url), record=RecordConfig(db=str(tmp / f"bytes-{i}.db")),
        ) for i in range(shards)]
        stats = [RunStats() for _ in configs]
        await asyncio.gather(*(run(c, stats=s) for c, s in zip(configs, stats, strict=True)))
    per_shard = []
    for config, s in zip(configs, stats, strict=True):
        assert s.bus is not None and config.record.db is not None
        local_bytes = s.bus.events_local * mean_event_bytes(Path(config.record.db))
        per_shard.append({"broker": s.bus.bytes_in, "local_events": s.bus.events_local, "local": local_bytes})
    return {"npcs": npcs, "shards": shards, "ticks": ticks, "per_shard": per_shard}


def mean_event_bytes(db: Path) -> float:
    """The mean msgpack size of the events in the shard's places' logs."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        keys = [k for (blob,) in conn.execute("SELECT items FROM place_events") for k in unpack_keys(blob)]
        sizes: dict[int, int] = dict(conn.execute("SELECT k, length(body) FROM items"))
    return sum(sizes[k] for k in keys) / max(len(keys), 1)


# --- the report ------------------------------------------------------------------------------


def median(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose `key` is the median (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: float(r[key]))[(len(runs) - 1) // 2]


def child(argv: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", *argv], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child {argv} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def ratio(value: float, target: float, *, at_most: bool = False) -> str:
    r = value / target
    return f"{r:.2f}, {'met' if (r <= 1 if at_most else r >= 1) else 'NOT met'}"


def spread(world: dict[str, Any]) -> str:
    """Where the median run stands among several runs of a world ("" for one run)."""
    low, high = world.get("run_range", (world["run_s"], world["run_s"]))
    return f"; the median run, all of them {low:.1f} to {high:.1f} s" if low != high else ""


def report(worlds: list[dict[str, Any]], sharded: list[dict[str, Any]], command: str) -> str:
    rows = []
    for w in worlds:
        name = f"{w['npcs'] // 1000}k"
        tick_ms, floor_ms = 1000 * w["run_s"] / w["ticks"], 1000 * w["floor_s"] / w["ticks"]
        plain_ms = 1000 * w["plain_floor_s"] / w["ticks"]
        ticks_s = w["ticks"] / w["run_s"]
        target = TARGETS.get(f"ticks/s {name}")
        kb = w["rss_per_npc"] / 1024
        kb_target = TARGETS.get(f"KB per NPC {name}")
        rows += [
            (name, "ticks/s", f"{ticks_s:.2f} ({w['ticks']} ticks in {w['run_s']:.1f} s{spread(w)})",
             f">= {target} (ratio {ratio(ticks_s, target)})" if target else "-"),
            (name, "barrier wait per tick", f"{w['barrier_ms']:.1f} ms", f"<= {TARGETS['barrier ms']:.0f} ms"
             f" (ratio {ratio(w['barrier_ms'], TARGETS['barrier ms'], at_most=True)})"),
            (name, "RSS per NPC (ready) / peak RSS", f"{kb:.1f} KB / {w['peak_mb']:,.0f} MB",
             f"<= {kb_target} KB (ratio {ratio(kb, kb_target, at_most=True)})" if kb_target else "-"),
            (name, "engine per inference", f"{1000 * w['run_s'] / max(w['inferences'], 1):.2f} ms"
             f" ({w['inferences']:,} inferences)", "-"),
            (name, "engine per perceived event", f"{1e6 * w['run_s'] / max(w['perceived'], 1):.1f} µs"
             f" ({w['perceived']:,} perceived)", "-"),
            (name, "engine per tick / floor per tick", f"{tick_ms:,.0f} ms / {floor_ms:,.0f} ms",
             f"<= {TARGETS['floor ratio']:.0f}x (ratio {tick_ms / floor_ms:.2f}x: "
             f"{'met' if tick_ms / floor_ms <= TARGETS['floor ratio'] else 'NOT met'})"),
            (name, "floor with each record as plain msgpack (not packed)",
             f"{plain_ms:,.0f} ms (engine per tick {tick_ms / plain_ms:.2f}x)",
             "-"),
            (name, "start-up (call to first tick)", f"{w['startup_s']:.1f} s", "-"),
            (name, "CPU during the ticks: the shard's process / its children", f"{w['cpu_s']:.1f} s /"
             f" {w['children_cpu_s']:.1f} s (serving: {SERVING[w['serving']]})", "-"),
        ]
        if "inprocess" in w:
            alone = w["inprocess"]
            alone_s = alone["ticks"] / alone["run_s"]
            rows.append((name, "ticks/s serving in the shard's own process (`--set inference.placement=in-process`)",
                         f"{alone_s:.2f} (the worker process: {ticks_s / alone_s:.2f}x)", "-"))
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    loads = ", ".join(f"{w['load']:.1f}" for w in worlds)
    text = f"""Command: `{command}`
(generated worlds, one shard, the real pipeline: SQLite store file, the pool serving with the
scripted backend in its worker process (the default from 1,000 NPCs), a private Mosquitto from
`--broker auto`). The children's CPU is the worker process's and Mosquitto's, their start-up
included. Machine: {machine_line(("msgspec", "aiomqtt"))}.
Load average (1 min) when each world began: {loads}.

The floor is the same ticks' essential work from the run's own audit records, in a tight
loop with no broker: each speaker's working memory built from its state, its inference
request encoded and its audit record packed as the store keeps it (its items and its
blob), the tick's rows written with one `executemany` per table. It runs on the engine's
footing: in a process of its own (nothing the run rendered is remembered), the records
loaded first and then frozen, with the engine's tick-time collector. The floor as first
defined (each record as plain msgpack, one row) is given too.

| world | measure | figure | target |
|---|---|---|---|
{table}
"""
    if sharded:
        one = sum(p["broker"] + p["local"] for p in sharded[0]["per_shard"]) / len(sharded[0]["per_shard"])
        lines = []
        for s in sharded:
            per = s["per_shard"]
            broker = sum(p["broker"] for p in per) / len(per)
            local = sum(p["local"] for p in per) / len(per)
            events = sum(p["local_events"] for p in per) / len(per)
            total = broker + local
            met = "met" if total / one <= TARGETS["bytes ratio"] else "NOT met"
            against = f" (target <= {TARGETS['bytes ratio']}x: {met})" if s["shards"] == 4 else ""
            lines.append(f"| {s['shards']} | {broker / 1e3:,.1f} KB | {events:,.0f} events, {local / 1e3:,.1f} KB |"
                         f" {total / 1e3:,.1f} KB | {total / one:.2f}x{against} |")
        text += f"""
Bytes each shard takes in, {sharded[0]['ticks']} ticks of the {sharded[0]['npcs']:,}-NPC world with 1, 2 and 4
shards in one process on one private Mosquitto (mean per shard; local bytes are the
events' msgpack size as stored in the shard's places' logs: they are never encoded):

| shards | from the broker | delivered locally | total per shard | vs 1 shard |
|---|---|---|---|---|
{chr(10).join(lines)}
"""
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", default="10k,100k", help="comma-separated: 10k, 100k (default both)")
    parser.add_argument("--ticks", type=int, default=None, help="ticks per world (default 20 for 10k, 5 for 100k)")
    parser.add_argument("--bytes-world", default="100k", help="the world of the bytes-per-shard runs")
    parser.add_argument("--bytes-ticks", type=int, default=3)
    parser.add_argument("--no-bytes", action="store_true", help="leave out the bytes-per-shard runs")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each world (and floors); the report gives the median and the range")
    parser.add_argument("--in-process-too", action="store_true",
                        help="run each world again serving its inferences in the shard's own process")
    parser.add_argument("--write", type=Path, help="put the section into this markdown file")
    parser.add_argument("--scenario", type=Path,
                        help="instead of the report: run this scenario file --ticks ticks (default 20) once and print"
                        " the ticks' seconds, CPU seconds and inferences (to compare checkouts: PYTHONPATH=...)")
    parser.add_argument("--serving", choices=SERVING, default="auto", help="with --scenario: where to serve")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scenario:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "engine.db"
            one = asyncio.run(engine_run(args.scenario, args.ticks or 20, db, serving=args.serving))
        print(f"{one['ticks']} ticks in {one['run_s']:.2f} s; CPU {one['cpu_s']:.2f} s here, "
              f"{one['children_cpu_s']:.2f} s in children; {one['inferences']:,} inferences; serving "
              f"{args.serving}; load {one['load']:.2f}")
        return
    if args.child:
        kind, *values = args.child
        if kind == "engine":
            npcs, locations, ticks, directory, serving = values
            scenario = write_scenario(Path(directory) / "world.toml", npcs=int(npcs), locations=int(locations), seed=1)
            result = asyncio.run(engine_run(scenario, int(ticks), Path(directory) / "engine.db", serving=serving))
        elif kind == "floor":
            directory, form = values
            key = "floor_s" if form == "packed" else "plain_floor_s"
            result = {key: floor(Path(directory) / "engine.db", packed=form == "packed")}
        else:
            npcs, locations, ticks, shards = values
            with tempfile.TemporaryDirectory() as tmp:
                result = asyncio.run(bytes_run(int(npcs), int(locations), int(ticks), int(shards), Path(tmp)))
        print(json.dumps(result))
        return
    worlds = []
    for name in args.worlds.split(","):
        npcs, locations, ticks = WORLDS[name]
        runs, alone = [], []
        for _ in range(args.repeats):  # alternating, so that a drift of the machine's speed hits both alike
            with tempfile.TemporaryDirectory() as tmp:
                world = child(["engine", str(npcs), str(locations), str(args.ticks or ticks), tmp, "auto"])
                world |= child(["floor", tmp, "packed"]) | child(["floor", tmp, "plain"])
            runs.append(world)
            if args.in_process_too:
                with tempfile.TemporaryDirectory() as tmp:
                    alone.append(child(["engine", str(npcs), str(locations), str(args.ticks or ticks), tmp,
                                        "inprocess"]))
        world = median(runs, "run_s") | {"floor_s": median(runs, "floor_s")["floor_s"],
                                         "plain_floor_s": median(runs, "plain_floor_s")["plain_floor_s"],
                                         "run_range": (min(r["run_s"] for r in runs), max(r["run_s"] for r in runs))}
        if alone:
            world["inprocess"] = median(alone, "run_s")
        worlds.append(world)
        print(f"{name}: {worlds[-1]}", file=sys.stderr)
    sharded = []
    if not args.no_bytes:
        npcs, locations, _ = WORLDS[args.bytes_world]
        for shards in (1, 2, 4):
            sharded.append(child(["bytes", str(npcs), str(locations), str(args.bytes_ticks), str(shards)]))
            print(f"bytes, {shards} shards: {sharded[-1]}", file=sys.stderr)
    command = "python benchmarks/bench_engine.py " + " ".join(sys.argv[1:])
    section = report(worlds, sharded, command.strip())
    print(section)
    if args.write:
        write_section(args.write, HEADING, section)


if __name__ == "__main__":
    main()
