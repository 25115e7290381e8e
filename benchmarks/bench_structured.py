"""Structured replies from a real small model: how many parse, are repaired to their `say`, fall back.

The bundled village with every NPC set to `output = "structured"` runs `--ticks` ticks (30
by default) against llama.cpp's own server and the bundled SmolLM2-135M (`make llama-server`,
4 slots, a fresh server for each endpoint), at temperature 0, on the completions and the chat
endpoint. From the run's audit, each structured reply ended one way: it parsed (the reply
was a JSON object with a string `say`, on its first attempt or its retry), it was salvaged
(its `say` alone, from a reply that was no valid object) or it fell back. Target: at least
80 % parsed on both endpoints (a benchmark, not a test). Each `--option NAME=VALUE` is a
backend option of the runs (`structured_max_tokens`, `frequency_penalty`, `repeat_penalty`,
`dry_multiplier`, ...; docs/inference.md), so that a setting can be measured before it is
made a default.

    .venv/bin/python benchmarks/bench_structured.py [--ticks 30] [--option NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from sim.audit import AuditRecord
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader
from tests.helpers import VILLAGE, MosquittoProcess, require_mosquitto
from tests.llama_server import SLOTS, LlamaServer, require_llama_server

ENDPOINTS = ("completions", "chat")


def every_npc_structured(folder: Path) -> Path:
    """The bundled village, every NPC's replies structured."""
    text = re.sub(r'^output = "structured"\n', "", Path(VILLAGE).read_text(), flags=re.M)
    path = folder / "village-structured.toml"
    path.write_text(text.replace("[[npcs]]\n", '[[npcs]]\noutput = "structured"\n'))
    return path


def outcome(record: AuditRecord) -> str:
    """"parsed", "salvaged" or "fallback": how a structured reply ended."""
    if record.fallback:
        return "fallback"
    said = record.attempts[-1].proposals[0]
    return "salvaged" if said.code == "salvaged" else "parsed"


async def measure(scenario: Path, broker: str, workdir: Path, endpoint: str, ticks: int,
                  extra: dict[str, Any]) -> str:
    """One run on `endpoint` against a fresh server: its line of counts."""
    binary, model = require_llama_server()
    server = LlamaServer(binary, model, workdir / f"llama-{endpoint}.log")
    db = workdir / f"{endpoint}.db"
    options = {"base_url": server.base_url, "model": "smollm2", "endpoint": endpoint, "temperature": 0.0,
               "read_timeout": 300.0, **extra}
    config = RunConfig(
        scenario=str(scenario), run_id=f"structured-{endpoint}", ticks=ticks, broker=BrokerConfig(url=broker),
        record=RecordConfig(db=str(db)),
        inference=InferenceConfig(backend="openai", backend_options=options, concurrency=SLOTS,
                                  inference_timeout=600.0, placement="in-process"),
    )
    try:
        await run(config, stats=RunStats())
    finally:
        server.stop()
    with open_reader(db) as reader:
        records = [r for r in reader.audit_records() if r.output is not None and r.output.structured]
    ended = Counter(outcome(r) for r in records)
    attempts = sum(len(r.attempts) for r in records)
    first = sum(not r.fallback and len(r.attempts) == 1 and r.attempts[0].problem is None for r in records)
    tokens = max((a.usage.completion_tokens or 0 for r in records for a in r.attempts if a.usage), default=0)
    models = sorted({Path(a.served_by.model).name for r in records for a in r.attempts
                     if a.served_by and a.served_by.model})
    share = 100 * ended["parsed"] / max(len(records), 1)
    return (f"{endpoint}: {len(records)} structured replies ({attempts} attempts) of {', '.join(models) or '?'}: "
            f"{ended['parsed']} parsed ({share:.0f} %; {first} on the first attempt), {ended['salvaged']} salvaged, "
            f"{ended['fallback']} fell back; the longest reply {tokens} tokens")


def option(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    return name, json.loads(value)


async def bench(args: argparse.Namespace, workdir: Path) -> list[str]:
    scenario = every_npc_structured(workdir)
    mosquitto = MosquittoProcess(require_mosquitto(), workdir)
    mosquitto.start()
    lines = []
    try:
        for endpoint in ENDPOINTS:
            lines.append(await measure(scenario, mosquitto.url, workdir, endpoint, args.ticks, dict(args.option)))
            print(lines[-1], flush=True)
    finally:
        mosquitto.stop()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--option", type=option, action="append", default=[],
                        help="a backend option of the runs, NAME=VALUE (VALUE as JSON)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="npcsim-structured-") as tmp:
        asyncio.run(bench(args, Path(tmp)))
    load = os.getloadavg()
    print(f"`{' '.join(['.venv/bin/python', 'benchmarks/bench_structured.py', *sys.argv[1:]])}`; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
