"""The tick barrier: its cost per tick, and ticks/s of 1 vs 2 shards on one machine.

A generated world (10,000 NPCs by default), scripted backend, a private Mosquitto from
broker-config/dev.conf; each shard is its own process (so two shards can use two cores),
each with its own SQLite store. Per shard it reports the time spent waiting at the
barrier per tick (after the first tick, which also waits for the other shards to start)
and the run's ticks/s from the moment the last shard was ready to the end.

    python benchmarks/bench_barrier.py --npcs 10000 --locations 100 --ticks 20
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from sim.generate import write_scenario
from sim.resources import broker_config_dir
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStarted, run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shard(config: RunConfig, results: Any) -> None:
    """One shard process: run, then report (ready time, end time, stats) on the queue."""
    marks: dict[str, float] = {}

    def ready(_: RunStarted) -> None:
        marks["ready"] = time.time()

    stats = asyncio.run(run(config, on_ready=ready))
    results.put(
        {
            "shard": stats.shard,
            "ready": marks["ready"],
            "end": time.time(),
            "ticks": stats.ticks_done,
            "barrier_ms": 1000 * stats.barrier_seconds / max(stats.barrier_ticks, 1),
            "inferences": stats.inferences,
        }
    )


def measure(world: Path, url: str, shards: int, ticks: int, tmp: Path) -> list[dict[str, Any]]:
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    procs = []
    for i in range(shards):
        config = RunConfig(
            scenario=str(world), run_id=f"bench{shards}", until_tick=ticks, shard=f"{i}/{shards}",
            broker=BrokerConfig(url=url), inference=InferenceConfig(concurrency=256),
            record=RecordConfig(db=str(tmp / f"bench{shards}-{i}.db")),
        )
        proc = spawn.Process(target=_shard, args=(config, results))
        proc.start()
        procs.append(proc)
    got = [results.get(timeout=1800) for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"a shard exited with {proc.exitcode}")
    return sorted(got, key=lambda r: r["shard"])


def main(npcs: int, locations: int, ticks: int) -> None:
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        world = write_scenario(tmp / "world.toml", npcs=npcs, locations=locations, seed=1)
        port = _free_port()
        conf = tmp / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\n" + (broker_config_dir() / "dev.conf").read_text())
        broker = subprocess.Popen([mosquitto, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            version = subprocess.run([mosquitto, "-h"], capture_output=True, text=True).stdout.splitlines()[0]
            print(f"machine: {multiprocessing.cpu_count()} cores ({platform.machine()}), "
                  f"Python {platform.python_version()}, {version}")
            print(f"world: {npcs} NPCs, {locations} locations, {ticks} ticks, scripted backend")
            for shards in (1, 2):
                rows = measure(world, f"mqtt://127.0.0.1:{port}", shards, ticks, tmp)
                start = max(r["ready"] for r in rows)
                end = max(r["end"] for r in rows)
                done = min(r["ticks"] for r in rows)
                inferences = sum(r["inferences"] for r in rows)
                waits = ", ".join(f"shard {r['shard']} {r['barrier_ms']:.1f} ms" for r in rows)
                print(f"{shards} shard(s): {done / (end - start):.2f} ticks/s ({inferences} inferences); "
                      f"barrier wait per tick: {waits}")
        finally:
            broker.terminate()
            broker.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--npcs", type=int, default=10_000)
    parser.add_argument("--locations", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    main(args.npcs, args.locations, args.ticks)
