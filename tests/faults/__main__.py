"""`python -m tests.faults SEEDS...` (what `make faults` runs): one line per schedule, then the total.

Each argument is a seed or a range `A-B`, or `N` alone for seeds 1..N; `--world`, `--shards`, `--ticks` pin
what every schedule draws. A failure prints its seed, its schedule and its first differences;
the exit code is 1 when any schedule failed.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.faults.runner import run_schedule
from tests.faults.schedule import draw


def seeds(words: list[str]) -> list[int]:
    """`N` alone: 1..N; otherwise each word a seed or a range `A-B`."""
    if len(words) == 1 and words[0].isdigit():
        return list(range(1, int(words[0]) + 1))
    chosen: list[int] = []
    for word in words:
        first, _, last = word.partition("-")
        chosen += range(int(first), int(last or first) + 1)
    return chosen


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make faults")
    parser.add_argument("seeds", nargs="+", help='seeds ("1 2 3"), or one count N for seeds 1..N')
    parser.add_argument("--world", choices=("village", "generated"))
    parser.add_argument("--shards", type=int, choices=(1, 2, 3))
    parser.add_argument("--ticks", type=int)
    parser.add_argument("--keep", type=Path, help="keep each schedule's files (stores, logs) under this folder")
    args = parser.parse_args(argv)
    failed = injected = kills = lost = acked = 0
    chosen = seeds(args.seeds)
    for seed in chosen:
        schedule = draw(seed, world=args.world, shards=args.shards, ticks=args.ticks)
        started = time.monotonic()
        if args.keep is not None:
            where = args.keep / f"seed{seed}"
            where.mkdir(parents=True, exist_ok=True)
            outcome = await run_schedule(schedule, where)
        else:
            with tempfile.TemporaryDirectory(prefix=f"npcsim-faults-{seed}-") as temporary:
                outcome = await run_schedule(schedule, Path(temporary))
        injected += outcome.faults
        kills += outcome.shard_kills
        lost += outcome.inputs_lost
        acked += outcome.inputs_acked
        kinds = ",".join(f.kind for f in schedule.faults)
        verdict = "ok" if outcome.ok else "FAILED"
        print(f"seed {seed}: {verdict} {schedule.world} {schedule.shards} shard(s) {schedule.ticks} ticks, "
              f"{outcome.faults} fault(s) [{kinds}], {outcome.records} records, "
              f"{outcome.inputs_acked} inputs ({outcome.inputs_lost} lost), {outcome.skipped} step(s) too late, "
              f"{time.monotonic() - started:.0f} s",
              flush=True)
        if not outcome.ok:
            failed += 1
            print(schedule.describe())
            for problem in outcome.problems:
                print(f"  - {problem}")
            sys.stdout.flush()
    print(f"shard kill -9s: {kills}, outside inputs: {acked} acknowledged, {lost} lost")
    print(f"{len(chosen)} schedules, {injected} faults injected, {failed} failed")
    return 1 if failed else 0


async def _cancelled_on_sigterm(argv: list[str]) -> int:
    """`main`, cancelled by SIGTERM as by Ctrl-C, so every schedule's processes and namespace go with it."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await main(argv)
    except asyncio.CancelledError:
        print("stopped: every process and namespace of the schedule was removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(asyncio.run(_cancelled_on_sigterm(sys.argv[1:])))
