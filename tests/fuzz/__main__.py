"""`python -m tests.fuzz SEEDS...` (what `make fuzz` runs): one line per seed, then the totals.

Each argument is a seed or a range `A-B`, or `N` alone for seeds 1..N; `--payloads` sets how
many hostile payloads each seed sends. Odd seeds have their inferences served by a remote
worker. The exit code is 1 when any seed failed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
from pathlib import Path

from tests.faults.__main__ import seeds
from tests.fuzz.runner import clean_audit, fuzz_run, targets

PAYLOADS = 150


def _listed(counter: collections.Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counter.items()))


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make fuzz")
    parser.add_argument("seeds", nargs="+", help='seeds ("1 2 3"), or one count N for seeds 1..N')
    parser.add_argument("--payloads", type=int, default=PAYLOADS, help=f"payloads per seed (default {PAYLOADS})")
    args = parser.parse_args(argv)
    kinds: collections.Counter[str] = collections.Counter()
    on: collections.Counter[str] = collections.Counter()
    asked: collections.Counter[str] = collections.Counter()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="npcsim-fuzz-") as temporary:
        directory = Path(temporary)
        clean = await clean_audit(directory)
        for seed in seeds(args.seeds):
            started = time.monotonic()
            outcome = await fuzz_run(seed, args.payloads, directory, clean)
            kinds.update(outcome.sent)
            on.update(outcome.topics)
            asked.update(outcome.requests)
            verdict = "ok" if outcome.ok else "FAILED"
            served = "a remote worker" if outcome.remote else "in process"
            print(f"seed {seed} (inferences {served}): {verdict} {sum(outcome.sent.values())} payloads, counted by "
                  f"{_listed(outcome.counted)}; {sum(outcome.requests.values())} requests to the view, "
                  f"{time.monotonic() - started:.0f} s", flush=True)
            for problem in outcome.problems:
                print(f"  - {problem}")
            failed += not outcome.ok
    print("payloads by kind: " + _listed(kinds))
    print(f"on {len({t.topic for t in targets()})} topics: " + _listed(on))
    print("requests to the view: " + _listed(asked))
    print(f"{len(seeds(args.seeds))} seeds, {sum(kinds.values())} payloads, {failed} failed, nothing lost"
          if not failed else f"{len(seeds(args.seeds))} seeds, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
