"""Benchmark of `npcsim loadtest` (issue 6): 10,000 agents, in-process and through Mosquitto.

Targets: >= 50,000 snapshots/s built and checked across the cores (the sweep, in-process),
0 violations, and the round trip through Mosquitto no slower than 3x in-process at the
same concurrency. Each figure is printed with its ratio to its bound.

    .venv/bin/python benchmarks/bench_loadtest.py [--duration 10] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._report import machine_line, write_section  # noqa: E402
from sim.checkers import Violation, check_working_memory  # noqa: E402
from sim.loadtest import Checker, LoadTestConfig, LoadTestResult, default_processes, run_loadtest  # noqa: E402
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig  # noqa: E402

HEADING = "Load test (issue 6)"
TARGET_SNAPSHOTS = 50_000
TARGET_MQTT_RATIO = 3.0
AGENTS = 10_000
CONCURRENCY = 64


@contextlib.contextmanager
def private_mosquitto() -> Iterator[str]:
    """A Mosquitto from broker-config/dev.conf on a free loopback port; yields its URL."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\n" + (REPO / "broker-config" / "dev.conf").read_text())
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("mosquitto did not start") from None
                    time.sleep(0.05)
            yield f"mqtt://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=5)


def no_check(state: NpcState, player_input: str, config: WorkingMemoryConfig, wm: WorkingMemory) -> list[Violation]:
    """The peer: the same sweep with the checker left out, to show what checking costs."""
    return []


def run(config: LoadTestConfig, checker: Checker = check_working_memory) -> LoadTestResult:
    return asyncio.run(run_loadtest(config, checker=checker))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="scripted backend delay for the round trip")
    parser.add_argument("--write", type=Path, default=None, help="replace our section of this markdown file")
    args = parser.parse_args()
    cores = default_processes()
    budgets = {"default (2000 chars)": WorkingMemoryConfig(),
               "256 tokens": WorkingMemoryConfig(max_context_tokens=256)}
    lines: list[str] = []
    failures = 0

    def out(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    out(f"Command: `.venv/bin/python benchmarks/bench_loadtest.py --duration {args.duration:g} "
        f"--latency-ms {args.latency_ms:g}`. Machine: {machine_line(('msgspec', 'aiomqtt'))}; "
        f"{AGENTS:,} agents, seed 0.")
    out()
    out("Build-and-check sweep (the checker on every snapshot), one process per core, no round trip:")
    out()
    out("| budget | snapshots/s | / 50,000 target | build p50/p99 ms | check p50/p99 ms | violations | over budget "
        "| peak RSS MB |")
    out("|---|---|---|---|---|---|---|---|")
    for name, memory in budgets.items():
        r = run(LoadTestConfig(agents=AGENTS, duration_s=args.duration, concurrency=0, processes=cores,
                               memory=memory))
        failures += r.violations
        out(f"| {name} | {r.snapshots_per_s:,.0f} | {r.snapshots_per_s / TARGET_SNAPSHOTS:.2f} "
            f"| {r.build_latency.p50_ms:.3f}/{r.build_latency.p99_ms:.3f} "
            f"| {r.check_latency.p50_ms:.3f}/{r.check_latency.p99_ms:.3f} | {r.violations} | {r.over_budget:,} "
            f"| {r.peak_rss_mb:,.0f} |")
    peer = run(LoadTestConfig(agents=AGENTS, duration_s=args.duration, concurrency=0, processes=cores),
               checker=no_check)
    out(f"| default, build only (peer: checker left out) | {peer.snapshots_per_s:,.0f} "
        f"| {peer.snapshots_per_s / TARGET_SNAPSHOTS:.2f} | {peer.build_latency.p50_ms:.3f}/"
        f"{peer.build_latency.p99_ms:.3f} | - | - | {peer.over_budget:,} | {peer.peak_rss_mb:,.0f} |")
    out()
    out(f"Round trip (build + check + inference, scripted backend), concurrency {CONCURRENCY}, "
        "no sweep alongside. Through Mosquitto: a private broker from broker-config/dev.conf, the pool in "
        "this process, its worker in a child process of its own. \"slower\" is in-process inferences/s "
        "over Mosquitto inferences/s at the same concurrency (bound 3); the p50 ratio is shown too, but "
        "in-process requests at 0 ms barely overlap, so it compares a queue with no queue:")
    out()
    out("| budget | backend delay ms | transport | inferences/s | round trip p50/p95/p99 ms | violations "
        "| slower (bound 3) | p50 ratio |")
    out("|---|---|---|---|---|---|---|---|")
    with private_mosquitto() as url:
        for name, memory in budgets.items():
            for delay in (0.0, args.latency_ms):
                base: LoadTestResult | None = None
                for broker in (None, url):
                    r = run(LoadTestConfig(agents=AGENTS, duration_s=args.duration, concurrency=CONCURRENCY,
                                           processes=0, memory=memory, latency_ms=delay, broker=broker))
                    failures += r.violations
                    rt = r.round_trip_latency
                    slower = p50 = ""
                    if base is None:
                        base = r
                    else:
                        value = base.inferences_per_s / r.inferences_per_s
                        slower = f"{value:.2f}" + (" (over)" if value > TARGET_MQTT_RATIO else "")
                        p50 = f"{rt.p50_ms / base.round_trip_latency.p50_ms:.1f}"
                    out(f"| {name} | {delay:g} | {'mosquitto' if broker else 'in-process'} "
                        f"| {r.inferences_per_s:,.0f} | {rt.p50_ms:.2f}/{rt.p95_ms:.2f}/{rt.p99_ms:.2f} "
                        f"| {r.violations} | {slower} | {p50} |")
    out()
    full_s = 3 * args.duration
    r = run(LoadTestConfig(agents=AGENTS, duration_s=full_s, processes=cores))
    failures += r.violations
    out(f"Both parts at once, as `npcsim loadtest --agents {AGENTS} --duration {full_s:g}` runs them (sweep on "
        f"{cores} processes, round trip at concurrency 64 in-process, 0 ms): {r.snapshots_per_s:,.0f} snapshots/s "
        f"in the sweep, {r.all_snapshots_per_s:,.0f} snapshots/s in all ({r.snapshots:,} snapshots), "
        f"{r.inferences_per_s:,.0f} inferences/s, round trip p50/p95/p99 {r.round_trip_latency.p50_ms:.2f}/"
        f"{r.round_trip_latency.p95_ms:.2f}/{r.round_trip_latency.p99_ms:.2f} ms, {r.violations} violations, "
        f"{r.over_budget:,} over-budget snapshots, {r.fallbacks} fallbacks, peak RSS {r.peak_rss_mb:,.0f} MB.")
    out()
    out("Reading: the independent checker re-renders the prompt of every snapshot and costs about as much as "
        "the build itself (compare the build-only peer row). With a token budget, both the builder's exact "
        "recount and the checker's count run tiktoken on every prompt. Through Mosquitto, throughput stays near "
        "1,000 round trips/s whatever the backend delay: the MQTT transport's own ceiling on this machine (the "
        "pool, the broker and the worker share 2 cores; build and check take ~0.04 ms of each request). Figures "
        "move by up to ~30 % between runs.")
    out()
    if args.write is not None:
        write_section(args.write, HEADING, "\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
