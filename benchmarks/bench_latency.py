"""Publish-to-`say` latency of a player's question, with a real MQTT client, minus the model's time.

The village (`npcsim run village --tick-ms 1000`) runs as its own process on a private
Mosquitto (broker-config/dev.conf, as `--broker auto` starts it). A client, through sim.mqtt,
asks the innkeeper a question with an `id` on `player/visitor/input`, each at a point of the
tick drawn at random (a seeded pause of up to a tick after the last answer), and times
publish to the innkeeper's `say` whose `reply_to` is that id (docs/integrate.md). When the
run has ended, each answer's inference is looked up in the store's audit: the model's own
time is its `service_ms` (the backend's call, without the wait for a slot); "minus the
model" is the latency less that.

    python benchmarks/bench_latency.py                        # scripted backend, 30 questions
    python benchmarks/bench_latency.py --backend llamacpp --questions 12   # the model in-process
    python benchmarks/bench_latency.py --backend openai --questions 12     # llama-server, its slots
    python benchmarks/bench_latency.py --code /path/to/other/checkout   # the same client, other code

`--code DIR` runs the village with the sim package of DIR (its PYTHONPATH), for a before
and after; `--write` puts the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._report import machine_line, write_section
from sim.mqtt import BrokerAddress, Link, MqttTransport, ReconnectPolicy
from sim.resources import broker_config_dir
from sim.wire import topics
from sim.wire.events import decode_say, decode_status
from tests.helpers import free_port
from tests.llama_server import LlamaServer, require_llama_server

REPO = Path(__file__).resolve().parent.parent
RUN = "latency"
_MAIN = "import sys; from sim.cli import main; sys.exit(main(sys.argv[1:]))"


async def _ask(url: str, questions: int, tick_s: float, seed: int) -> list[tuple[str, float, str]]:
    """(id, publish-to-say seconds, inference id) for each question, asked once the run is going."""
    rng = random.Random(seed)
    got: list[tuple[str, float, str]] = []
    say = topics.agent_say(RUN, "innkeeper")

    async def session(link: Link) -> None:
        await link.subscribe([say, topics.status(RUN, "0")])
        answers: dict[str, asyncio.Future[tuple[float, str]]] = {}
        going = asyncio.Event()

        async def read() -> None:
            async for topic, payload, _ in link.messages():
                now = time.perf_counter()
                if topic == say:
                    message = decode_say(payload)
                    waiting = answers.get(message.reply_to or "")
                    if waiting is not None and not waiting.done():
                        waiting.set_result((now, message.inference_id))
                elif (decode_status(payload).tick or 0) >= 2:
                    going.set()

        reader = asyncio.create_task(read())
        try:
            await asyncio.wait_for(going.wait(), 120)
            for n in range(questions):
                await asyncio.sleep(rng.uniform(0, tick_s))  # a point of the tick, drawn
                question = f"q{n}"
                answers[question] = asyncio.get_running_loop().create_future()
                body = json.dumps({"to": "innkeeper", "text": f"Is there a room for the night? ({n})", "id": question})
                sent = time.perf_counter()
                await link.publish(topics.player_input(RUN, "visitor"), body.encode(), qos=1, retain=False)
                at, inference = await asyncio.wait_for(answers[question], 300)
                got.append((question, at - sent, inference))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    await MqttTransport(BrokerAddress.parse(url), name="bench-latency", policy=ReconnectPolicy()).run(session)
    return got


_MODEL_MS = """import json, sys
from sim.store import open_reader
with open_reader(sys.argv[1]) as reader:
    print(json.dumps({r.id: r.timings.get("service_ms", 0.0) for r in reader.audit_records("innkeeper")}))
"""


async def _model_ms(db: Path, code: str, env: dict[str, str]) -> dict[str, float]:
    """Each inference's model time (its backend's call), by inference id, read by the code
    that wrote the store (its format is that code's)."""
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", _MODEL_MS, str(db), cwd=code, env=env,
                                                 stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    return {str(k): float(v) for k, v in json.loads(out).items()}


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return (f"median {statistics.median(ordered):,.0f} ms, p90 {p90:,.0f} ms, "
            f"min {ordered[0]:,.0f} ms, max {ordered[-1]:,.0f} ms")


async def measure(args: argparse.Namespace, tmp: Path) -> str:
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\n" + (broker_config_dir() / "dev.conf").read_text())
    broker = await asyncio.create_subprocess_exec(mosquitto, "-c", str(conf), stdout=asyncio.subprocess.DEVNULL,
                                                  stderr=asyncio.subprocess.DEVNULL)
    url, db = f"mqtt://127.0.0.1:{port}", tmp / "latency.db"
    code = args.code
    env = {**os.environ, "PYTHONPATH": code}
    backend = ["--backend", args.backend]
    if args.backend == "llamacpp":
        backend += ["--set", "inference.backend_options.n_threads=2"]
    server = None
    if args.backend == "openai":  # llama.cpp's own server, its slots serving NPCs side by side
        binary, model_file = require_llama_server()
        server = LlamaServer(binary, model_file, tmp / "llama-server.log")
        backend += ["--base-url", server.base_url, "--model", "smollm2", "--slot-affinity", "--cache-reuse", "8",
                    "--set", "inference.backend_options.endpoint=completions"]
    village = None
    try:
        await asyncio.sleep(0.5)  # the broker's listener
        village = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _MAIN, "run", "village", "--broker", url, "--run-id", RUN, "--tick-ms",
            str(args.tick_ms), "--ticks", "1000000000", "--db", str(db), "--quiet", *backend, cwd=code, env=env,
            stdout=asyncio.subprocess.DEVNULL)
        asked = await _ask(url, args.questions, args.tick_ms / 1000, args.seed)
    finally:
        if village is not None and village.returncode is None:
            village.send_signal(signal.SIGINT)
            await village.wait()
        broker.terminate()
        await broker.wait()
        if server is not None:
            server.stop()
    model = await _model_ms(db, code, env)
    latency = [1000 * seconds for _, seconds, _ in asked]
    less = [ms - model.get(inference, 0.0) for (_, _, inference), ms in zip(asked, latency, strict=True)]
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: ASYNC240 - one small read, the run is over
    lines = [
        f"`python benchmarks/bench_latency.py --backend {args.backend} --tick-ms {args.tick_ms} "
        f"--questions {args.questions}` (code: {code}); load average {load}; {machine_line()}",
        "",
        f"- publish to `say`, {len(latency)} questions: {_summary(latency)}",
        f"- the model's own time: {_summary([model.get(i, 0.0) for _, _, i in asked])}",
        f"- publish to `say` minus the model's time: {_summary(less)}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="scripted", choices=("scripted", "llamacpp", "openai"))
    parser.add_argument("--tick-ms", type=int, default=1000)
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--code", default=str(REPO), help="the checkout whose sim package runs the village")
    parser.add_argument("--write", action="store_true", help="put the figures in docs/benchmarks.md")
    args = parser.parse_args()
    args.code = str(Path(args.code).resolve())
    with tempfile.TemporaryDirectory() as name:
        report = asyncio.run(measure(args, Path(name)))
    print(report)
    if args.write:
        write_section(REPO / "docs" / "benchmarks.md", f"Publish-to-say latency, {args.backend}", report)


if __name__ == "__main__":
    main()
