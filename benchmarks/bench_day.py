"""What a day costs: the same generated world with and without homes, workplaces and schedules.

`npcsim scenario generate --npcs N --locations L` and the same with `--day` (same seed: the
same NPCs at the same homes; with a day, each also has a workplace, for about half of them
another place, from 8 to 18, `ticks_per_day = 24`), each run on one shard for a whole day
(24 ticks: the two hours when half the world walks, and the hours between), scripted
backend, `--broker auto`, a real store file, through `bench_engine.engine_run`, each run in a
child process of its own, the two worlds alternating `--repeats` times, each run begun
once the load average has fallen below 0.8 (the run before leaves its load behind). The report gives the
engine's time per tick (start-up left out) with and without schedules and their ratio, the
moves and the share of NPCs moving at each hour that moves anyone, and the inferences per
NPC-tick: routines and moves cost no inference.

`--million` runs a world of 1,000,000 NPCs over 10,000 places with a day for 3 ticks
instead, and the same world without one, and gives start-up, the ticks' time and peak RSS;
its workday begins at hour 1 instead of 8, so that its 3 ticks hold the hour when half the
world walks. The scenario is read in the parent only after the runs (a child's peak RSS
counts what its parent held when it was forked).

    .venv/bin/python benchmarks/bench_day.py                           # 100k, one repeat
    .venv/bin/python benchmarks/bench_day.py --repeats 2 --write docs/benchmarks.md
    .venv/bin/python benchmarks/bench_day.py --million --write docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import machine_line, write_section
from benchmarks.bench_engine import engine_run
from sim.day import Routine
from sim.generate import write_scenario
from sim.scenario import load_scenario

HEADING = "A day: homes, workplaces and schedules"
TARGET_RATIO = 1.25


def movers_by_hour(scenario_path: Path) -> tuple[int, dict[int, int]]:
    """The NPCs, and how many change place at each hour (an hour that moves anyone)."""
    scenario = load_scenario(scenario_path)
    moving: Counter[int] = Counter()
    for spec in scenario.npcs:
        routine = Routine(spec.schedule)
        for hour in routine.changes:
            if routine.place_at(hour, spec.location)[0] != routine.place_at(hour - 1, spec.location)[0]:
                moving[hour] += 1
    return len(scenario.npcs), dict(sorted(moving.items()))


def quiet(below: float = 0.8, at_most: float = 300.0) -> None:
    """Wait until the load average of the last minute falls below `below` (the run before
    leaves its own load behind), at most `at_most` seconds."""
    waited = 0.0
    while os.getloadavg()[0] >= below and waited < at_most:
        time.sleep(5)
        waited += 5


def run_child(scenario: Path, ticks: int, db: Path) -> dict[str, Any]:
    """One run in a child process of its own (its peak RSS is its own), on a quiet machine."""
    quiet()
    began = os.getloadavg()[0]
    out = subprocess.run([sys.executable, __file__, "--child", str(scenario), str(ticks), str(db)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child {scenario} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["load_began"], result["load_ended"] = began, result["load"]
    return result


def report(runs: dict[str, list[dict[str, Any]]], movers: dict[int, int], npcs: int, command: str,
           ticks: int) -> str:
    def median_tick_ms(world: str) -> tuple[float, list[float]]:
        per_tick = sorted(1000 * r["run_s"] / r["ticks"] for r in runs[world])
        return per_tick[(len(per_tick) - 1) // 2], per_tick

    plain, plain_all = median_tick_ms("plain")
    day, day_all = median_tick_ms("day")
    ratio = day / plain
    last = {world: r[-1] for world, r in runs.items()}
    share = ", ".join(f"{hour}:00 {100 * n / npcs:.1f} %" for hour, n in movers.items()) or "none"
    def listed(values: list[float]) -> str:
        return ", ".join(f"{x:,.0f}" for x in values)

    rows = [
        ("engine time per tick, without schedules", f"{plain:,.0f} ms (runs: {listed(plain_all)})", "-"),
        ("engine time per tick, with schedules", f"{day:,.0f} ms (runs: {listed(day_all)})",
         f"<= {TARGET_RATIO}x the other"),
        ("ratio", f"{ratio:.2f}x", f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}"),
        ("NPCs moving, by hour", share, "-"),
        ("moves in the run (with schedules)", f"{last['day']['moves']:,}", "-"),
        ("inferences per NPC-tick, without / with", f"{last['plain']['per_npc_tick']:.4f} / "
         f"{last['day']['per_npc_tick']:.4f}", "-"),
        ("peak RSS, without / with", f"{last['plain']['peak_mb']:,.0f} MB / {last['day']['peak_mb']:,.0f} MB", "-"),
        ("start-up, without / with", f"{last['plain']['startup_s']:.1f} s / {last['day']['startup_s']:.1f} s", "-"),
    ]
    loads = ", ".join(f"{r['load_began']:.2f} ({r['load_ended']:.2f})" for rs in runs.values() for r in rs)
    lines = [
        f"Command: `{command}` ({npcs:,} NPCs, {ticks} ticks a run; the two worlds alternating). "
        f"{machine_line()} Load average when each run began (and when it ended): {loads}.",
        "",
        "| measure | figure | target |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
    ]
    return "\n".join(lines) + "\n"


async def child_main(scenario: str, ticks: str, db: str) -> None:
    result = await engine_run(Path(scenario), int(ticks), Path(db))
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npcs", type=int, default=100_000)
    parser.add_argument("--locations", type=int, default=1_000)
    parser.add_argument("--ticks", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--million", action="store_true", help="1,000,000 NPCs over 10,000 places, 3 ticks")
    parser.add_argument("--write", type=Path, help="put the section into this markdown file")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child_main(*args.child))
        return
    if args.million:
        args.npcs, args.locations, args.ticks = 1_000_000, 10_000, 3
    command = " ".join(["benchmarks/bench_day.py", *sys.argv[1:]])
    with tempfile.TemporaryDirectory() as tmp:
        worlds = {
            "plain": write_scenario(Path(tmp) / "plain.toml", npcs=args.npcs, locations=args.locations, seed=1),
            "day": write_scenario(Path(tmp) / "day.toml", npcs=args.npcs, locations=args.locations, seed=1, day=True),
        }
        if args.million:  # the workday begins at hour 1: the 3 ticks hold a move of half the world
            worlds["day"].write_text(worlds["day"].read_text().replace("{ hour = 8,", "{ hour = 1,"))
        runs: dict[str, list[dict[str, Any]]] = {"plain": [], "day": []}
        for repeat in range(args.repeats):
            for world, path in worlds.items():
                db = Path(tmp) / f"{world}-{repeat}.db"
                result = run_child(path, args.ticks, db)
                runs[world].append(result)
                print(f"{world}: {result['ticks']} ticks in {result['run_s']:.1f} s, start-up "
                      f"{result['startup_s']:.1f} s, peak {result['peak_mb']:,.0f} MB, load "
                      f"{result['load_began']:.2f} to {result['load_ended']:.2f}",
                      file=sys.stderr)
                db.unlink(missing_ok=True)
        npcs, movers = movers_by_hour(worlds["day"])
    text = report(runs, movers, npcs, command, args.ticks)
    print(text)
    if args.write:
        heading = f"{HEADING}: {'1,000,000' if args.million else f'{args.npcs:,}'} NPCs"
        write_section(args.write, heading, text)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
