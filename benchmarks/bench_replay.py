"""Passes over a recorded 10,000-NPC run: the what-if (`npcsim replay --set`) and `npcsim audit replay`.

The run: `npcsim scenario generate --npcs 10000 --locations 100`, then `npcsim run --broker
auto --ticks 20 --db` (or `--db FILE`, a store of such a run already made). Each command
is timed end to end as a user runs it (a fresh process: start-up, planning, the worker
processes), `--repeat` times, with the load average beside each figure:
- the what-if over three budgets: inferences re-rendered per second = records x budgets /
  wall time (target >= 20,000/s);
- `npcsim audit replay` with every core and with one: records per second (target >= 8,000/s).
The CPU time of each command (its workers included) is given too: on a loaded machine the
wall time says more about the load than about the code.

    .venv/bin/python benchmarks/bench_replay.py [--db k10.db] [--budgets 700,1000,2000] [--jobs N]
        [--repeat 2] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._report import machine_line, write_section

_CLI = "import sys; from sim.cli import main; sys.exit(main(sys.argv[1:]))"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def npcsim(*args: str) -> tuple[float, float, str]:
    """Run `npcsim ARGS` in a fresh process: (wall s, CPU s of it and its workers, standard output).

    A failure stops the benchmark.
    """
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CLI, *args], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"npcsim {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return wall, _children_cpu() - cpu, done.stdout


def make_run(folder: Path, ticks: int) -> Path:
    world, db = folder / "k10.toml", folder / "k10.db"
    npcsim("scenario", "generate", "--npcs", "10000", "--locations", "100", "--out", str(world))
    wall, _, _ = npcsim("run", str(world), "--broker", "auto", "--ticks", str(ticks), "--db", str(db), "--quiet")
    print(f"the run: {ticks} ticks in {wall:.1f} s", file=sys.stderr)
    return db


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", type=Path, default=None, help="a store of the run (default: make one, 20 ticks)")
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--budgets", default="700,1000,2000", help="max_context_chars values of the what-if")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--write", type=Path, default=None, help="replace the section in this Markdown file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        db = args.db if args.db is not None else make_run(Path(tmp), args.ticks)
        report = Path(tmp) / "what-if.json"
        budgets = args.budgets.split(",")
        rows = []
        records = 0
        for n in range(args.repeat):
            wall, cpu, _ = npcsim("replay", "--db", str(db), "--set", f"max_context_chars={args.budgets}",
                                  "--jobs", str(args.jobs), "--json", str(report))
            records = json.loads(report.read_text())["records"]
            done = records * len(budgets)
            rows.append(("what-if, " + f"{len(budgets)} budgets, --jobs {args.jobs}", n + 1, wall, done / wall, cpu,
                         done / cpu, "inferences re-rendered", load()))
            for jobs in (args.jobs, 1):
                wall, cpu, out = npcsim("audit", "replay", "--db", str(db), "--jobs", str(jobs))
                if "all byte-identical" not in out:
                    sys.exit(f"audit replay: {out.strip()}")
                rows.append((f"audit replay, --jobs {jobs}", n + 1, wall, records / wall, cpu, records / cpu,
                             "records", load()))
    lines = [
        f"Machine: {machine_line()}. Store: {db.name}, {records:,} audit records; budgets {args.budgets}.",
        "",
        "| command | run | wall s | per wall second | CPU s (all processes) | per CPU second | of | load average "
        "(1/5/15 min) after |",
        "|---|---:|---:|---:|---:|---:|---|---|",
        *(f"| {c} | {n} | {w:.2f} | {r:,.0f} | {cpu:.2f} | {rc:,.0f} | {u} | {la} |"
          for c, n, w, r, cpu, rc, u, la in rows),
    ]
    text = "\n".join(lines)
    print(text)
    if args.write is not None:
        write_section(args.write, "Replay of a recorded run", "Command: `.venv/bin/python benchmarks/bench_replay.py"
                      f" --db {db.name}`.\n\n" + text)


if __name__ == "__main__":
    main()
