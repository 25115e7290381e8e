"""Re-execution (`npcsim replay`): ticks/s of a recorded run executed again, against the original's.

A generated world of N NPCs runs `--ticks` ticks on one shard (scripted backend, SQLite
store file, a private Mosquitto from `--broker auto`); its ticks/s is timed from the first
tick to the end (as benchmarks/bench_scale.py times it). The same run is then executed
again from its store (sim.replay: one process, no broker, every inference answered with
its recorded replies), timed the same way, and compared record by record with the
original (it must be identical).

    python benchmarks/bench_rerun.py --npcs 10000 --locations 100 --ticks 20
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks._report import machine_line, write_section
from benchmarks.bench_scale import measure
from sim.generate import write_scenario
from sim.replay import compare, execute, load_recording
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig

HEADING = "Re-execution of a recorded run"


async def main(args: argparse.Namespace) -> str:
    ticks, load = args.ticks, psutil.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_scenario(Path(tmp) / "world.toml", npcs=args.npcs, locations=args.locations, seed=1)
        db = Path(tmp) / "original.db"
        _, stats, original_s = await measure(RunConfig(
            scenario=str(path), ticks=ticks, run_id="rerun", broker=BrokerConfig(url="auto"),
            inference=InferenceConfig(concurrency=256), record=RecordConfig(db=str(db)),
        ))
        started = time.perf_counter()
        recording = await asyncio.to_thread(load_recording, [db])
        load_s = time.perf_counter() - started
        executed = await execute(recording, Path(tmp) / "again.db")
        started = time.perf_counter()
        comparison = await asyncio.to_thread(compare, recording, executed)
        compare_s = time.perf_counter() - started
    assert comparison.divergence is None, comparison.divergence.describe()
    original_ticks_s = ticks / original_s
    rerun_ticks_s = ticks / executed.tick_seconds
    ratio = rerun_ticks_s / original_ticks_s
    verdict = f">= the original's (ratio {ratio:.2f}, {'met' if ratio >= 1 else 'NOT met'})"
    command = (f".venv/bin/python benchmarks/bench_rerun.py --npcs {args.npcs} --locations {args.locations} "
               f"--ticks {ticks}")
    rows = [
        ("original run: ticks/s (first tick to end)", f"{original_ticks_s:.2f} ({ticks} ticks in {original_s:.1f} s, "
         f"{stats.inferences:,} inferences)", "-"),
        ("re-execution: ticks/s (first tick to end)", f"{rerun_ticks_s:.2f} ({ticks} ticks in "
         f"{executed.tick_seconds:.1f} s)", verdict),
        ("re-execution in all (store, agents, ticks)", f"{executed.seconds:.1f} s", "-"),
        ("reading the recording (every store, every record)", f"{load_s:.1f} s", "-"),
        ("comparison (every record, every NPC's final state)", f"{compare_s:.1f} s "
         f"({comparison.records:,} records, {comparison.npcs:,} NPCs: identical)", "-"),
    ]
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    return f"""Command: `{command}`
(generated world, one shard, scripted backend; the original on a private Mosquitto with an SQLite
store file, the re-execution from that file in one process without a broker). Machine:
{machine_line(("msgspec", "aiomqtt"))}. Load average when the run began: {load[0]:.1f}.

| measure | figure | target |
|---|---|---|
{table}
"""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--npcs", type=int, default=10_000)
    parser.add_argument("--locations", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--write", type=Path, help="put the section into this markdown file")
    arguments = parser.parse_args()
    section = asyncio.run(main(arguments))
    print(section)
    if arguments.write:
        write_section(arguments.write, HEADING, section)
