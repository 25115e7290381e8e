"""The load test's model-server sweep (issue 14) against the test suite's fake OpenAI server.

The server (tests/fake_openai.py, real HTTP on loopback, in a thread with its own event
loop) answers every request after `--delay-ms` and serves at most `--capacity` at a time,
as a model server with a full batch does. The sweep must find its knee at the capacity;
it is the load test's method checked against a server whose answer is known, not a model
benchmark.

    .venv/bin/python benchmarks/bench_loadtest_sweep.py [--capacity 8] [--delay-ms 200] [--duration 10]
        [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._report import machine_line, write_section  # noqa: E402
from sim.loadtest import LoadTestConfig, run_loadtest  # noqa: E402
from tests.fake_openai import open_fake_openai  # noqa: E402

HEADING = "Load-test sweep against the test server (issue 14)"
LEVELS = (1, 2, 4, 8, 16, 32)
AGENTS = 2000


@contextlib.contextmanager
def fake_server(capacity: int, delay_s: float) -> Iterator[str]:
    """The fake OpenAI server in a thread; yields its base URL."""
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        async with open_fake_openai() as fake:
            fake.capacity, fake.delay_s = capacity, delay_s
            holder.update(url=fake.base_url, stop=stop, loop=asyncio.get_running_loop())
            started.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        if not started.wait(30):
            raise RuntimeError("the fake server did not start")
        yield str(holder["url"])
    finally:
        if "loop" in holder:
            holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--write", type=Path, help="write the section into this markdown file")
    args = parser.parse_args()
    with fake_server(args.capacity, args.delay_ms / 1000) as url:
        r = asyncio.run(run_loadtest(LoadTestConfig(
            agents=AGENTS, duration_s=args.duration, concurrency=LEVELS, processes=0, backend="openai",
            backend_options={"base_url": url},
        )))
    lines = [
        f"Command: `.venv/bin/python benchmarks/bench_loadtest_sweep.py --capacity {args.capacity} "
        f"--delay-ms {args.delay_ms:g} --duration {args.duration:g}`, the same as `npcsim loadtest --agents "
        f"{AGENTS} --duration {args.duration:g} --processes 0 --backend openai --base-url URL --concurrency "
        f"{','.join(map(str, LEVELS))}` against tests/fake_openai.py serving {args.capacity} requests at a time, "
        f"each after {args.delay_ms:g} ms (so at most {args.capacity / (args.delay_ms / 1000):g} inferences/s). "
        f"Machine: {machine_line(('msgspec', 'httpx'))}; shared with other work while measured.",
        "",
        "| concurrency | inferences/s | p50 ms | p95 ms | p99 ms | fallbacks | prompt tok/s | completion tok/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in r.sweep:
        lines.append(
            f"| {p.concurrency} | {p.inferences_per_s:,.1f} | {p.latency.p50_ms:,.1f} | {p.latency.p95_ms:,.1f} | "
            f"{p.latency.p99_ms:,.1f} | {p.fallbacks} | {p.prompt_tokens_per_s or 0:,.0f} | "
            f"{p.completion_tokens_per_s or 0:,.0f} |"
        )
    ceiling = args.capacity / (args.delay_ms / 1000)
    at = {p.concurrency: p for p in r.sweep}
    full, top = at.get(args.capacity), r.sweep[-1]
    lines += ["", f"Knee: concurrency {r.budgets[0].knee_concurrency} (beyond it inferences/s rose by less than "
              f"10 %). The server serves {args.capacity} at a time, {ceiling:g} inferences/s at most"
              + (f"; at concurrency {args.capacity} the sweep reached {full.inferences_per_s / ceiling:.0%} of that "
                 f"(p50 {full.latency.p50_ms:,.0f} ms)" if full else "")
              + f"; at {top.concurrency}, {top.inferences_per_s / ceiling:.0%} (p50 {top.latency.p50_ms:,.0f} ms). "
              f"Violations {r.violations}. The token rates are the fake server's `usage`, which counts words."]
    body = "\n".join(lines)
    print(body)
    if args.write:
        write_section(args.write, HEADING, body)


if __name__ == "__main__":
    main()
