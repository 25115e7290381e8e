"""Scale: a generated world of N NPCs in one shard, scripted replies, a private Mosquitto.

Measures events delivered/s (events put into agents' mailboxes after the broker round
trip), ticks/s, inferences/s, and RSS per idle agent (RSS after the agents are built and
subscribed, minus RSS before, over N). Prints each figure against its target.

    python benchmarks/bench_scale.py --npcs 10000 --locations 100 --ticks 20
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import sys
import tempfile
import time
from pathlib import Path

import psutil

from sim.generate import write_scenario
from sim.runner import RunConfig, RunStats, run

TARGET_EVENTS_PER_S = 20_000
TARGET_RSS_PER_AGENT = 20 * 1024


async def main(npcs: int, locations: int, ticks: int) -> None:
    process = psutil.Process()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_scenario(Path(tmp) / "world.toml", npcs=npcs, locations=locations, seed=1)
        gc.collect()
        marks: dict[str, float] = {}

        def ready(stats: RunStats) -> None:
            gc.collect()
            marks["rss_ready"] = process.memory_info().rss
            marks["t0"] = time.perf_counter()
            marks["delivered0"] = stats.bus.events_delivered

        config = RunConfig(scenario=str(path), broker="auto", ticks=ticks, run_id="scale", concurrency=256)
        # The baseline: the same process with the scenario parsed and a broker up, no agents.
        from sim.scenario import load_scenario

        load_scenario(path)
        gc.collect()
        rss_base = process.memory_info().rss
        stats = await run(config, on_ready=ready)
        elapsed = time.perf_counter() - marks["t0"]
    delivered = stats.bus.events_delivered - marks["delivered0"]
    per_agent = (marks["rss_ready"] - rss_base) / npcs
    events_s = delivered / elapsed
    print(f"machine: {psutil.cpu_count()} cores, Python {platform.python_version()}, {sys.platform}")
    print(f"world: {npcs} NPCs, {locations} locations, {ticks} ticks, one shard, scripted, {stats.broker}")
    ratio = events_s / TARGET_EVENTS_PER_S
    print(f"events delivered/s: {events_s:,.0f} (target >= {TARGET_EVENTS_PER_S:,}; ratio {ratio:.2f})")
    print(f"ticks/s: {ticks / elapsed:.2f}")
    print(f"inferences/s: {stats.inferences / elapsed:,.0f} ({stats.inferences} inferences)")
    print(
        f"RSS per idle agent: {per_agent / 1024:.1f} KB "
        f"(target <= {TARGET_RSS_PER_AGENT // 1024} KB; ratio {per_agent / TARGET_RSS_PER_AGENT:.2f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--npcs", type=int, default=10_000)
    parser.add_argument("--locations", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.npcs, args.locations, args.ticks))
