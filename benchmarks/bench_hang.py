"""The village against an OpenAI-compatible server that never answers (issue 12).

A loopback HTTP server accepts every request and never replies. `npcsim run`'s pipeline
(private Mosquitto when on PATH, SQLite store with the audit) runs the village for 20 ticks
with `--set inference.inference_timeout=2`; the wall time, the inferences and their fallback reasons (read
back from the audit) are printed. Target: within 60 s, every line a recorded fallback.

    .venv/bin/python benchmarks/bench_hang.py [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import tempfile
import time
from pathlib import Path

from benchmarks._report import machine_line, write_section
from sim.shard import InferenceConfig, RecordConfig, RunConfig, run
from sim.store import open_reader

REPO = Path(__file__).resolve().parent.parent
HEADING = "A hanging backend (issue 12)"
COMMAND = ".venv/bin/python benchmarks/bench_hang.py --write docs/benchmarks.md"


async def _hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.read()  # read until the client gives up; never answer
    finally:
        writer.close()


async def measure(ticks: int, inference_timeout: float) -> str:
    server = await asyncio.start_server(_hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "hang.db"
            config = RunConfig(
                scenario=str(REPO / "scenarios" / "village.toml"), ticks=ticks,
                inference=InferenceConfig(backend="openai", backend_options={"base_url": f"http://127.0.0.1:{port}/v1"},
                                          inference_timeout=inference_timeout),
                record=RecordConfig(db=str(db)),
            )
            started = time.monotonic()
            stats = await run(config)
            elapsed = time.monotonic() - started
            with open_reader(db) as reader:
                reasons = collections.Counter(r.fallback_reason or "none" for r in reader.audit_records())
    finally:
        server.close()
    listed = ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items()))
    return (
        f"Command: `{COMMAND}` (the village, {ticks} ticks, `--backend openai` against a loopback server that "
        f"never answers, `--set inference.inference_timeout={inference_timeout:g}`, "
        f"read timeout derived: {inference_timeout / 2:g} s).\n\n"
        f"Machine: {machine_line(('msgspec', 'httpx'))}; loaded by other engineers' test runs.\n\n"
        f"| measure | value |\n|---|---|\n| wall time | {elapsed:.1f} s |\n| inferences | {stats.inferences} |\n"
        f"| fallback lines | {stats.fallbacks} |\n| fallback reasons (audit) | {listed} |\n\n"
        "Reading: the first hangs end in the backend's own read timeout, count as failures and open the "
        "circuit breaker; later inferences fail fast (`circuit_open`) until a probe after the cooldown. "
        "The same from the command line: `npcsim run scenarios/village.toml --ticks 20 --backend openai "
        "--base-url http://127.0.0.1:PORT/v1 --set inference.inference_timeout=2`. "
        "Before issue 12 the read timeout equalled "
        "the 30 s pool timeout, a hang ended as a cancellation the breaker never counted, and 4 ticks took "
        "120 s (the issue's figure, not measured here).\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    body = asyncio.run(measure(args.ticks, args.timeout))
    print(body)
    if args.write is not None:
        write_section(args.write, HEADING, body)


if __name__ == "__main__":
    main()
