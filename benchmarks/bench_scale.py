"""Scale: a generated world of N NPCs in one shard, scripted replies, a private Mosquitto.

Measures events delivered/s (events put into agents' mailboxes after the broker round
trip), ticks/s, inferences/s, and RSS per agent. Prints each figure against its target.

    python benchmarks/bench_scale.py --npcs 10000 --locations 100 --ticks 20

With `--resume-check` (the issue-11 mode, run as `--npcs 100000 --locations 1000`), the
shard's database is a real file: the run is timed from the call to the first tick (start-up
from a fresh database), then started again with `--resume` on the same file and stopped
as soon as it is ready (start-up on resume). RSS per NPC is then everything the shard holds
for its NPCs: (RSS when ready - RSS before the run) / N, the parsed scenario included.
Two shards are not measured: the shards-in-step barrier is not on main yet.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks._report import machine_line, write_section
from sim.generate import write_scenario
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStarted, RunStats, run

HEADING = "100,000 NPCs (issue 11)"
TARGET_EVENTS_PER_S = 20_000
TARGET_RSS_PER_AGENT = 20 * 1024
TARGET_FRESH_S = 60.0
TARGET_RESUME_S = 30.0
TARGET_TICKS_PER_S = 0.2


class Measured:
    """One run's figures, from the call of `run` to its end."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        gc.collect()
        self.rss_before = self.process.memory_info().rss
        self.started = time.perf_counter()
        self.ready_at = 0.0
        self.rss_ready = 0
        self.broker_rss = 0
        self.delivered_at_ready = 0

    def ready(self, started: RunStarted) -> None:
        stats = started.stats
        self.ready_at = time.perf_counter()
        gc.collect()
        self.rss_ready = self.process.memory_info().rss
        self.broker_rss = sum(child.memory_info().rss for child in self.process.children(recursive=True))
        self.delivered_at_ready = stats.bus.events_delivered

    @property
    def startup_s(self) -> float:
        return self.ready_at - self.started


async def measure(config: RunConfig, *, stop_when_ready: bool = False) -> tuple[Measured, RunStats, float]:
    """Run once; the figures, the stats and the seconds from the first tick to the end."""
    m = Measured()
    stop = asyncio.Event()

    def ready(started: RunStarted) -> None:
        m.ready(started)
        if stop_when_ready:
            stop.set()

    stats = await run(config, on_ready=ready, stop=stop)
    return m, stats, time.perf_counter() - m.ready_at


def ratio(value: float, target: float, *, at_most: bool = False) -> str:
    r = value / target
    return f"ratio {r:.2f}, {'met' if (r <= 1 if at_most else r >= 1) else 'NOT met'}"


async def main(args: argparse.Namespace) -> str:
    npcs, locations, ticks = args.npcs, args.locations, args.ticks
    load = psutil.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_scenario(Path(tmp) / "world.toml", npcs=npcs, locations=locations, seed=1)
        db = Path(tmp) / "scale.db"
        base = RunConfig(
            scenario=str(path), ticks=ticks, run_id="scale", broker=BrokerConfig(url="auto"),
            inference=InferenceConfig(concurrency=256), record=RecordConfig(db=str(db)),
        )
        fresh, stats, run_s = await measure(base)
        resumed = None
        if args.resume_check:
            resumed, _, _ = await measure(
                RunConfig(
                    scenario=str(path), ticks=1, run_id="scale", broker=BrokerConfig(url="auto"),
                    inference=InferenceConfig(concurrency=256), record=RecordConfig(db=str(db), resume=True),
                ),
                stop_when_ready=True,
            )
    ticks_run = stats.ticks_done
    delivered = stats.bus.events_delivered - fresh.delivered_at_ready
    per_npc = (fresh.rss_ready - fresh.rss_before) / npcs
    events_s = delivered / run_s
    ticks_s = ticks_run / run_s
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    command = (f".venv/bin/python benchmarks/bench_scale.py --npcs {npcs} --locations {locations} --ticks {ticks}"
               + (" --resume-check" if args.resume_check else ""))
    rows = [
        ("start-up from a fresh database (call to first tick)", f"{fresh.startup_s:.1f} s",
         f"<= {TARGET_FRESH_S:.0f} s ({ratio(fresh.startup_s, TARGET_FRESH_S, at_most=True)})"),
    ]
    if resumed is not None:
        rows.append(("start-up on resume (same file, `--resume`)", f"{resumed.startup_s:.1f} s",
                     f"<= {TARGET_RESUME_S:.0f} s ({ratio(resumed.startup_s, TARGET_RESUME_S, at_most=True)})"))
    rows += [
        ("RSS per NPC (shard process, scenario included)", f"{per_npc / 1024:.1f} KB",
         f"<= {TARGET_RSS_PER_AGENT // 1024} KB ({ratio(per_npc, TARGET_RSS_PER_AGENT, at_most=True)})"),
        ("ticks/s (scripted backend)", f"{ticks_s:.2f} ({ticks_run} ticks in {run_s:.1f} s)",
         f">= {TARGET_TICKS_PER_S} ({ratio(ticks_s, TARGET_TICKS_PER_S)})"),
        ("events delivered/s", f"{events_s:,.0f}",
         f">= {TARGET_EVENTS_PER_S:,} ({ratio(events_s, TARGET_EVENTS_PER_S)})"),
        ("inferences/s", f"{stats.inferences / run_s:,.0f} ({stats.inferences:,} in {ticks_run} ticks)", "-"),
        ("shard RSS when ready / peak", f"{fresh.rss_ready / 2**20:,.0f} MB / {peak_mb:,.0f} MB", "-"),
        ("broker (Mosquitto) RSS when ready", f"{fresh.broker_rss / 2**20:,.0f} MB", "-"),
    ]
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    return f"""Command: `{command}`
(generated world, one shard, the real pipeline: SQLite store file, in-process pool with the
scripted backend, a private Mosquitto from `--broker auto`). Machine: {machine_line(("msgspec", "aiomqtt"))}.
Load average when the run began: {load[0]:.1f} (other engineers' tests shared the 2 cores).

| measure | figure | target |
|---|---|---|
{table}

Two shards: not measured; the shards-in-step barrier is not on main yet.
"""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--npcs", type=int, default=10_000)
    parser.add_argument("--locations", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--resume-check", action="store_true", help="also time start-up on resume")
    parser.add_argument("--write", type=Path, help="put the section into this markdown file")
    arguments = parser.parse_args()
    section = asyncio.run(main(arguments))
    print(section)
    if arguments.write:
        write_section(arguments.write, HEADING, section)
