"""A real model served: npcsim against llama.cpp's own server, and that server's own limit.

For each workload (the village; a generated world of 200 NPCs) and each setting (`stable_prefix`
and slot affinity both off, then both on), a fresh llama-server (the bundled SmolLM2-135M,
4 slots, `make llama-server`) serves one npcsim run at temperature 0. From the run's audit:
inferences per second of the run's wall time, prompt tokens evaluated and reused per
inference as the server reported them, the cache hit share, and the p50/p95 of each
inference's time (queue and service, the record's `total_ms`).

The limit: the tuned run's recorded requests (every attempt, retries included, with the same
prompt, parameters, reply schema or stop sequence, and slot, in the run's order) sent
straight to a fresh server by a minimal client (httpx, nothing else) at concurrency 1, 2 and
4; its best rate, in the run's inferences per second, is what the server can do on that
work, measured in the same run. Targets (issue 36): npcsim at least 0.9x the direct client's best rate; with
`stable_prefix` and affinity, at least 2x fewer evaluated prompt tokens per inference than
without, and a higher rate.

    .venv/bin/python benchmarks/bench_serving.py [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks._report import machine_line, write_section
from sim.generate import generate_scenario
from sim.inference.backends.spread import rendezvous_order
from sim.memory import prefix_reuse
from sim.output import REPLY_SCHEMA
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader
from tests.helpers import VILLAGE, MosquittoProcess, require_mosquitto
from tests.llama_server import SLOTS, LlamaServer, require_llama_server

HEADING = "Serving a real model (issue 36)"
MAX_TOKENS = 32
SETTINGS = {"off": False, "on": True}  # stable_prefix and slot affinity together


@dataclass(frozen=True)
class Measured:
    """One run's (or one direct pass's) figures."""

    inferences: int
    seconds: float
    evaluated: int
    cached: int
    latencies_ms: tuple[float, ...]
    bound: float | None = None  # the hit share a server keeping every NPC's previous prompt could reach

    @property
    def rate(self) -> float:
        return self.inferences / self.seconds

    @property
    def hit_share(self) -> float:
        return self.cached / max(self.evaluated + self.cached, 1)

    def percentile(self, q: int) -> float:
        if len(self.latencies_ms) < 2:
            return self.latencies_ms[0] if self.latencies_ms else 0.0
        return statistics.quantiles(self.latencies_ms, n=100)[q - 1]


@dataclass(frozen=True)
class Request:
    """One recorded attempt, as the server was sent it: a structured reply's request carries
    the reply schema and no stop sequence, a line's the stop sequence (as npcsim's backend sends them)."""

    prompt: str
    structured: bool
    slot: int | None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "smollm2", "prompt": self.prompt, "max_tokens": MAX_TOKENS,
                                "temperature": 0.0}
        if self.structured:
            body["json_schema"] = REPLY_SCHEMA
        else:
            body["stop"] = ["\n"]
        if self.slot is not None:
            body["id_slot"] = self.slot
        return body


@contextmanager
def llama_server(log: Path) -> Iterator[LlamaServer]:
    """A fresh server: nothing cached from an earlier pass."""
    binary, model = require_llama_server()
    server = LlamaServer(binary, model, log)
    try:
        yield server
    finally:
        server.stop()


def scenario_text(workload: str, stable: bool) -> str:
    if workload == "village":
        text = Path(VILLAGE).read_text()
    else:
        text = generate_scenario(npcs=200, locations=20, seed=7, ambient_chance=0.05)
    return text + ("\n[memory]\nstable_prefix = true\n" if stable else "")


async def npcsim_run(server: LlamaServer, broker: str, workdir: Path, workload: str, ticks: int,
                     stable: bool) -> tuple[Measured, list[Request]]:
    """One run; its figures and its requests (every attempt, in the run's order)."""
    scenario = workdir / f"{workload}-{stable}.toml"
    scenario.write_text(scenario_text(workload, stable))
    db = workdir / f"{workload}-{stable}.db"
    options = {"base_url": server.base_url, "model": "smollm2", "endpoint": "completions",
               "max_tokens": MAX_TOKENS, "temperature": 0.0, "read_timeout": 300.0, "slot_affinity": stable}
    config = RunConfig(
        scenario=str(scenario), run_id=f"serving-{workload}-{stable}", ticks=ticks,
        broker=BrokerConfig(url=broker), record=RecordConfig(db=str(db)),
        inference=InferenceConfig(backend="openai", backend_options=options, concurrency=SLOTS,
                                  inference_timeout=600.0, placement="in-process"),
    )
    started = time.perf_counter()
    await run(config, stats=RunStats())
    seconds = time.perf_counter() - started
    evaluated = cached = 0
    latencies: list[float] = []
    requests: list[Request] = []
    slots = [str(n) for n in range(SLOTS)]
    previous: dict[str, str] = {}
    shared = total = 0
    with open_reader(db) as reader:
        for record in reader.audit_records():
            for attempt in record.attempts:
                shared += prefix_reuse(previous.get(record.agent_id, ""), attempt.prompt).chars
                total += len(attempt.prompt)
                previous[record.agent_id] = attempt.prompt
            latencies.append(record.timings.get("total_ms", 0.0))
            for attempt in record.attempts:
                if attempt.usage is not None and attempt.usage.prompt_tokens is not None:
                    reused = attempt.usage.cached_tokens or 0
                    cached += reused
                    evaluated += attempt.usage.prompt_tokens - reused
            slot = int(rendezvous_order(record.agent_id, slots)[0]) if stable else None
            structured = record.output is not None and record.output.structured
            requests.extend(Request(attempt.prompt, structured, slot) for attempt in record.attempts)
    bound = shared / max(total, 1)
    return Measured(len(latencies), seconds, evaluated, cached, tuple(latencies), bound), requests


async def direct(server: LlamaServer, requests: list[Request], inferences: int, concurrency: int) -> Measured:
    """The requests sent straight to the server, `concurrency` at a time, in order; the rate
    counts the run's `inferences` they served."""
    queue = list(reversed(requests))
    latencies: list[float] = []
    evaluated = cached = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal evaluated, cached
        while queue:
            request = queue.pop()
            sent = time.perf_counter()
            response = await http.post(f"{server.base_url}/completions", json=request.body())
            response.raise_for_status()
            latencies.append(1000 * (time.perf_counter() - sent))
            timings = response.json().get("timings", {})
            evaluated += int(timings.get("prompt_n", 0))
            cached += int(timings.get("cache_n", 0))

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600.0) as http, asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(client(http))
    return Measured(inferences, time.perf_counter() - started, evaluated, cached, tuple(latencies))


def row(name: str, m: Measured) -> str:
    n = max(m.inferences, 1)
    return (f"| {name} | {m.inferences} | {m.rate:.2f} | {m.evaluated / n:.0f} | {m.cached / n:.0f} | "
            f"{100 * m.hit_share:.1f} % | {'' if m.bound is None else f'{100 * m.bound:.1f} %'} | "
            f"{m.percentile(50):.0f} | {m.percentile(95):.0f} |")


async def bench(args: argparse.Namespace, workdir: Path) -> str:
    mosquitto = MosquittoProcess(require_mosquitto(), workdir)
    mosquitto.start()
    lines = ["| run | inferences | inferences/s | evaluated/inference | reused/inference | hit share | "
             "previous-prompt bound | p50 ms | p95 ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    verdicts: list[str] = []
    try:
        for workload, ticks in (("village", args.village_ticks), ("world-200", args.world_ticks)):
            measured: dict[str, Measured] = {}
            tuned: list[Request] = []
            for name, stable in SETTINGS.items():
                print(f"{workload}: stable_prefix and affinity {name}, {ticks} ticks ...", flush=True)
                with llama_server(workdir / f"llama-{workload}-{name}.log") as server:
                    measured[name], requests = await npcsim_run(server, mosquitto.url, workdir, workload,
                                                                ticks, stable)
                lines.append(row(f"{workload}, npcsim, stable_prefix + affinity {name}", measured[name]))
                print(lines[-1], flush=True)
                if stable:
                    tuned = requests
            best: tuple[int, Measured] | None = None
            for concurrency in args.direct:
                with llama_server(workdir / f"llama-{workload}-direct-{concurrency}.log") as server:
                    m = await direct(server, tuned, measured["on"].inferences, concurrency)
                lines.append(row(f"{workload}, direct client, concurrency {concurrency}", m))
                print(lines[-1], flush=True)
                if best is None or m.rate > best[1].rate:
                    best = (concurrency, m)
            assert best is not None
            off, on = measured["off"], measured["on"]
            fewer = (off.evaluated / max(off.inferences, 1)) / max(on.evaluated / max(on.inferences, 1), 1e-9)
            verdicts.append(
                f"- {workload}: npcsim (tuned) {on.rate:.2f} inferences/s = {on.rate / best[1].rate:.2f}x the direct "
                f"client's best ({best[1].rate:.2f}/s at concurrency {best[0]}; target >= 0.9x); "
                f"{fewer:.2f}x fewer evaluated prompt tokens per inference with stable_prefix + affinity "
                f"(target >= 2x); rate {on.rate / off.rate:.2f}x the untuned run's."
            )
    finally:
        mosquitto.stop()
    load = os.getloadavg()
    body = "\n".join([
        f"`{' '.join(['.venv/bin/python', 'benchmarks/bench_serving.py', *sys.argv[1:]])}`",
        "",
        f"Machine: {machine_line(('httpx',))}; llama-server {SLOTS} slots, one thread each pass; "
        f"load average after the runs {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.",
        f"Village {args.village_ticks} ticks, a generated world of 200 NPCs {args.world_ticks} ticks; "
        f"completions endpoint, temperature 0, max_tokens {MAX_TOKENS}; a fresh server for every row.",
        "npcsim's latencies are each inference's (queue and service), the direct client's each request's. "
        "The previous-prompt bound is the share of the prompts' characters that are a prefix of the same "
        "NPC's previous prompt: the hit share a server that kept every NPC's last prompt could reach "
        "(an NPC's first prompt is all new).",
        "",
        *lines,
        "",
        *verdicts,
    ])
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--village-ticks", type=int, default=60)
    parser.add_argument("--world-ticks", type=int, default=6)
    parser.add_argument("--direct", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4],
                        help="the direct client's concurrencies (default 1,2,4)")
    parser.add_argument("--write", type=Path, help="replace this section of FILE (docs/benchmarks.md)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="npcsim-serving-") as tmp:
        body = asyncio.run(bench(args, Path(tmp)))
    print(body)
    if args.write:
        write_section(args.write, HEADING, body)


if __name__ == "__main__":
    main()
