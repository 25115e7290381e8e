"""A real model served: npcsim against llama.cpp's own server, and that server's own limit.

For each workload (the village; a generated world of 200 NPCs) and each setting (the
sections layout with `stable_prefix` and slot affinity both off, the default; both on; both on
with llama.cpp's `cache_reuse` 16; `layout = "log"` with slot affinity; the same with
`cache_reuse` 16), a fresh llama-server (the bundled SmolLM2-135M, 4 slots, `make llama-server`) serves one
npcsim run at temperature 0. From the run's audit: inferences per second of the run's wall
time, prompt tokens evaluated and reused per inference as the server reported them, the cache
hit share, and the p50/p95 of each inference's time (queue and service, the record's
`total_ms`), and the share of the prompt tokens of every NPC's later prompts (its first
aside) that the server reused: all NPCs together, and the lowest NPC's.

The limit: the last setting's recorded requests (every attempt, retries included, with the
same prompt, parameters, reply schema or stop sequence, slot and cache reuse, in the run's
order) sent straight to a fresh server by a minimal client (httpx, nothing else) at each
`--direct` concurrency; its best rate, in the run's inferences per second, is what the server
can do on those requests, measured in the same run. The same client also sends them tick by
tick as the run could (a tick's records at once, the next tick after): the limit of this work,
where what an NPC hears next depends on what was said. Targets: npcsim at least 0.9x the
direct client's best rate; with `layout = "log"` and affinity, at least 85 % of the later
prompts' tokens reused and at least 2x fewer evaluated prompt tokens per inference than the
default.

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
from sim.inference.backends.spread import SlotTable
from sim.memory import prefix_reuse
from sim.output import MAX_LINE_CHARS, reply_schema, reply_tokens
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader
from tests.helpers import VILLAGE, MosquittoProcess, require_mosquitto
from tests.llama_server import SLOTS, LlamaServer, require_llama_server

HEADING = "Serving a real model"
MAX_TOKENS = 32
CACHE_REUSE = 8  # tokens: llama.cpp's n_cache_reuse in the settings that reuse chunks


@dataclass(frozen=True)
class Setting:
    """What a run is tuned with: the layout, `stable_prefix` (sections only), slot affinity,
    llama.cpp's cache reuse."""

    name: str
    layout: str = "sections"
    stable_prefix: bool = False
    affinity: bool = False
    cache_reuse: int = 0


SETTINGS = (
    Setting("sections, stable_prefix + affinity off"),
    Setting("sections, stable_prefix + affinity on", stable_prefix=True, affinity=True),
    Setting(f"sections, stable_prefix + affinity + cache_reuse {CACHE_REUSE}", stable_prefix=True, affinity=True,
            cache_reuse=CACHE_REUSE),
    Setting("log, affinity", layout="log", affinity=True),
    Setting(f"log, affinity + cache_reuse {CACHE_REUSE}", layout="log", affinity=True, cache_reuse=CACHE_REUSE),
)


@dataclass(frozen=True)
class Measured:
    """One run's (or one direct pass's) figures."""

    inferences: int
    seconds: float
    evaluated: int
    cached: int
    latencies_ms: tuple[float, ...]
    bound: float | None = None  # the hit share a server keeping every NPC's previous prompt could reach
    limit: int | None = None  # npcsim's adaptive limit for the server at the run's end
    later: tuple[float, float] | None = None  # later prompts' tokens reused: all NPCs, the lowest NPC

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
    schema: dict[str, Any] | None  # a structured reply's
    slot: int | None
    cache_reuse: int
    tick: int
    record: int  # the record's place in the audit: its attempts are sent one after the other

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "smollm2", "prompt": self.prompt, "max_tokens": MAX_TOKENS,
                                "temperature": 0.0}
        if self.schema is not None:
            body["json_schema"] = self.schema
            body["max_tokens"] = reply_tokens(self.schema)
        else:
            body["stop"] = ["\n"]
        if self.slot is not None:
            body["id_slot"] = self.slot
        if self.cache_reuse:
            body["n_cache_reuse"] = self.cache_reuse
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


def scenario_text(workload: str, setting: Setting) -> str:
    if workload == "village":
        text = Path(VILLAGE).read_text()
    else:
        text = generate_scenario(npcs=200, locations=20, seed=7, ambient_chance=0.05)
    stable = "true" if setting.stable_prefix else "false"
    return text + f'\n[memory]\nstable_prefix = {stable}\nlayout = "{setting.layout}"\n'


async def npcsim_run(server: LlamaServer, broker: str, workdir: Path, workload: str, ticks: int,
                     setting: Setting, index: int) -> tuple[Measured, list[Request]]:
    """One run; its figures and its requests (every attempt, in the run's order)."""
    scenario = workdir / f"{workload}-{index}.toml"
    scenario.write_text(scenario_text(workload, setting))
    db = workdir / f"{workload}-{index}.db"
    options = {"base_url": server.base_url, "model": "smollm2", "endpoint": "completions",
               "max_tokens": MAX_TOKENS, "temperature": 0.0, "read_timeout": 300.0, "slot_affinity": setting.affinity,
               "cache_reuse": setting.cache_reuse}
    config = RunConfig(
        scenario=str(scenario), run_id=f"serving-{workload}-{index}", ticks=ticks,
        broker=BrokerConfig(url=broker), record=RecordConfig(db=str(db)),
        inference=InferenceConfig(backend="openai", backend_options=options, concurrency=SLOTS,
                                  inference_timeout=600.0, placement="in-process"),
    )
    started = time.perf_counter()
    stats = RunStats()
    await run(config, stats=stats)
    seconds = time.perf_counter() - started
    evaluated = cached = 0
    latencies: list[float] = []
    requests: list[Request] = []
    slots = SlotTable(SLOTS)  # as the backend gives them: the first NPCs a slot each
    previous: dict[str, str] = {}
    shared = total = 0
    later: dict[str, list[int]] = {}  # per NPC, its later prompts' tokens: reused, in all
    with open_reader(db) as reader:
        for place, record in enumerate(reader.audit_records()):
            for attempt in record.attempts:
                shared += prefix_reuse(previous.get(record.agent_id, ""), attempt.prompt).chars
                total += len(attempt.prompt)
                if attempt.usage is not None and attempt.usage.prompt_tokens is not None:
                    reused = attempt.usage.cached_tokens or 0
                    cached += reused
                    evaluated += attempt.usage.prompt_tokens - reused
                    if record.agent_id in previous:
                        tally = later.setdefault(record.agent_id, [0, 0])
                        tally[0] += reused
                        tally[1] += attempt.usage.prompt_tokens
                previous[record.agent_id] = attempt.prompt
            latencies.append(record.timings.get("total_ms", 0.0))
            slot = slots.slot(record.agent_id) if setting.affinity else None
            policy = record.output
            schema = reply_schema(policy, MAX_LINE_CHARS) if policy is not None and policy.structured else None
            requests.extend(Request(attempt.prompt, schema, slot, setting.cache_reuse, record.tick, place)
                            for attempt in record.attempts)
    bound = shared / max(total, 1)
    limit = stats.server_limits.get(server.base_url)
    reused_later = None
    if later:
        every = sum(t[0] for t in later.values()) / max(sum(t[1] for t in later.values()), 1)
        reused_later = (every, min(t[0] / max(t[1], 1) for t in later.values()))
    return Measured(len(latencies), seconds, evaluated, cached, tuple(latencies), bound, limit,
                    reused_later), requests


class Direct:
    """A minimal client: the requests sent straight to the server, nothing else."""

    def __init__(self, server: LlamaServer, http: httpx.AsyncClient) -> None:
        self._url = f"{server.base_url}/completions"
        self._http = http
        self.latencies: list[float] = []
        self.evaluated = self.cached = 0

    async def send(self, request: Request) -> None:
        sent = time.perf_counter()
        response = await self._http.post(self._url, json=request.body())
        response.raise_for_status()
        self.latencies.append(1000 * (time.perf_counter() - sent))
        timings = response.json().get("timings", {})
        self.evaluated += int(timings.get("prompt_n", 0))
        self.cached += int(timings.get("cache_n", 0))

    def measured(self, inferences: int, seconds: float) -> Measured:
        return Measured(inferences, seconds, self.evaluated, self.cached, tuple(self.latencies))


async def direct(server: LlamaServer, requests: list[Request], inferences: int, concurrency: int) -> Measured:
    """The requests, `concurrency` at a time, in order, whatever tick they belong to; the rate
    counts the run's `inferences` they served."""
    queue = list(reversed(requests))

    async def worker(client: Direct) -> None:
        while queue:
            await client.send(queue.pop())

    async with httpx.AsyncClient(timeout=600.0) as http:
        client = Direct(server, http)
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker(client))
        return client.measured(inferences, time.perf_counter() - started)


async def direct_by_tick(server: LlamaServer, requests: list[Request], inferences: int) -> Measured:
    """The requests as the run could send them: a tick's records at once (at most the server's
    slots), each record's attempts one after the other, and a tick only after the one before,
    since what an NPC hears next depends on what was said."""
    by_tick: dict[int, dict[int, list[Request]]] = {}
    for request in requests:
        by_tick.setdefault(request.tick, {}).setdefault(request.record, []).append(request)
    slots = asyncio.Semaphore(SLOTS)

    async def attempts(client: Direct, these: list[Request]) -> None:
        async with slots:
            for request in these:
                await client.send(request)

    async with httpx.AsyncClient(timeout=600.0) as http:
        client = Direct(server, http)
        started = time.perf_counter()
        for tick in sorted(by_tick):
            async with asyncio.TaskGroup() as group:
                for these in by_tick[tick].values():
                    group.create_task(attempts(client, these))
        return client.measured(inferences, time.perf_counter() - started)


def row(name: str, m: Measured) -> str:
    n = max(m.inferences, 1)
    return (f"| {name} | {m.inferences} | {m.rate:.2f} | {m.evaluated / n:.0f} | {m.cached / n:.0f} | "
            f"{100 * m.hit_share:.1f} % | {'' if m.bound is None else f'{100 * m.bound:.1f} %'} | "
            f"{m.percentile(50):.0f} | {m.percentile(95):.0f} | {'' if m.limit is None else m.limit} | "
            f"{'' if m.later is None else f'{100 * m.later[0]:.1f} % ({100 * m.later[1]:.1f} %)'} |")


async def bench(args: argparse.Namespace, workdir: Path) -> str:
    mosquitto = MosquittoProcess(require_mosquitto(), workdir)
    mosquitto.start()
    lines = ["| run | inferences | inferences/s | evaluated/inference | reused/inference | hit share | "
             "previous-prompt bound | p50 ms | p95 ms | limit | later prompts reused (lowest NPC) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    verdicts: list[str] = []
    try:
        for workload, ticks in (("village", args.village_ticks), ("world-200", args.world_ticks)):
            if workload not in args.workloads:
                continue
            measured: list[Measured] = []
            last: list[Request] = []
            for index, setting in enumerate(SETTINGS):
                print(f"{workload}: {setting.name}, {ticks} ticks ...", flush=True)
                with llama_server(workdir / f"llama-{workload}-{index}.log") as server:
                    m, last = await npcsim_run(server, mosquitto.url, workdir, workload, ticks, setting, index)
                measured.append(m)
                lines.append(row(f"{workload}, npcsim, {setting.name}", m))
                print(lines[-1], flush=True)
            best: tuple[int, Measured] | None = None
            for concurrency in args.direct:
                with llama_server(workdir / f"llama-{workload}-direct-{concurrency}.log") as server:
                    m = await direct(server, last, measured[-1].inferences, concurrency)
                lines.append(row(f"{workload}, direct client, concurrency {concurrency}", m))
                print(lines[-1], flush=True)
                if best is None or m.rate > best[1].rate:
                    best = (concurrency, m)
            assert best is not None
            with llama_server(workdir / f"llama-{workload}-direct-ticks.log") as server:
                ordered = await direct_by_tick(server, last, measured[-1].inferences)
            lines.append(row(f"{workload}, direct client, tick by tick", ordered))
            print(lines[-1], flush=True)
            off, tuned = measured[0], measured[-1]
            verdicts.append(
                f"- {workload}: npcsim ({SETTINGS[-1].name}) {tuned.rate:.2f} inferences/s = "
                f"{tuned.rate / best[1].rate:.2f}x the direct client's best on its requests "
                f"({best[1].rate:.2f}/s at concurrency {best[0]}; target >= 0.9x), "
                f"{tuned.rate / ordered.rate:.2f}x its rate sending them tick by tick ({ordered.rate:.2f}/s)."
            )
            per_off = off.evaluated / max(off.inferences, 1)
            for setting, m in zip(SETTINGS[1:], measured[1:], strict=True):
                fewer = per_off / max(m.evaluated / max(m.inferences, 1), 1e-9)
                reuse = "" if m.later is None else (f"; later prompts {100 * m.later[0]:.1f} % reused, the lowest "
                                                    f"NPC's {100 * m.later[1]:.1f} % (target >= 85 % with the log)")
                verdicts.append(f"- {workload}, {setting.name}: {fewer:.2f}x fewer evaluated prompt tokens per "
                                f"inference than the default (target >= 2x with the log); rate "
                                f"{m.rate / off.rate:.2f}x the default's{reuse}.")
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
        "The direct client sends the last run's requests at a fixed concurrency in order, whatever tick "
        "they belong to (the server's limit), or tick by tick as the run could (a tick's records at once, "
        "each record's attempts in turn: the limit of this work, whose next tick depends on what was said). "
        "The previous-prompt bound is the share of the prompts' characters that are a prefix of the same "
        "NPC's previous prompt: the hit share a server that kept every NPC's last prompt could reach "
        "(an NPC's first prompt is all new). The limit is npcsim's adaptive limit for the server at the "
        "run's end (within inference.concurrency 4). Later prompts reused: the share of the prompt tokens "
        "of every NPC's prompts after its first that the server reused, all NPCs together and, in "
        "brackets, the NPC with the lowest share.",
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
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=["village", "world-200"],
                        help="which workloads (default village,world-200)")
    parser.add_argument("--write", type=Path, help="replace this section of FILE (docs/benchmarks.md)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="npcsim-serving-") as tmp:
        body = asyncio.run(bench(args, Path(tmp)))
    print(body)
    if args.write:
        write_section(args.write, HEADING, body)


if __name__ == "__main__":
    main()
