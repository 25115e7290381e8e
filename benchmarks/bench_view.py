"""The web view with the 10,000-NPC world, and what the trace topic costs per inference.

One shard of `npcsim scenario generate --npcs 10000 --locations 100` runs as fast as it
can on a private Mosquitto (`--broker auto`), first alone, then watched by the view on the
run's event loop, on its own thread and loop (as `npcsim run --view` does), and as
`npcsim view` in another process. Headless Chromium (Debian's, through selenium) opens the
page each time; measured: the time until the NPCs and the dialogue are on the page, the size of the
first JSON state, the event stream's updates and lines per second in the browser, the time
from clicking an NPC to its budget table, and the run's own ticks/s and inferences/s. Then,
over the run's audit records, what building and encoding a trace costs per inference (and
its size with and without the prompt), next to encoding the audit record itself.

    .venv/bin/python benchmarks/bench_view.py [--seconds 30] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec
from selenium import webdriver

from benchmarks._report import machine_line, write_section
from sim.audit import encode_record, trace_of
from sim.broker import free_port
from sim.generate import write_scenario
from sim.mqtt import ENV_PASSWORD, ENV_USERNAME
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStarted, RunStats, run
from sim.store import open_reader
from sim.view import LiveView, build_app, open_view_server, open_view_thread
from sim.wire.trace import encode_trace

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1500,950")
HEADER = ("| view | page load (s) | `/api/state` | stream updates/s | lines/s to the browser | click NPC to budget "
          "| run ticks/s / inferences/s | traces seen / inferences |\n|---|---|---|---|---|---|---|---|")
COUNT_STREAM = """
window.__updates = 0; window.__lines = 0;
const es = new EventSource('/api/events');
es.onmessage = (e) => { window.__updates++; window.__lines += JSON.parse(e.data).lines.length; };
"""


def browser(profile: Path) -> Any:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver"))


def wait(driver: Any, script: str, limit: float = 120.0) -> float:
    """Seconds until the JavaScript expression is true."""
    started = time.perf_counter()
    while not driver.execute_script(f"return {script};"):
        if time.perf_counter() - started > limit:
            raise TimeoutError(script)
        time.sleep(0.02)
    return time.perf_counter() - started


def page_figures(url: str, seconds: float, profile: Path) -> dict[str, float]:
    driver = browser(profile)
    try:
        started = time.perf_counter()
        driver.get(url)
        wait(driver, "document.querySelectorAll('.npc-chip').length > 0 && "
                     "document.querySelectorAll('#dialogue li').length > 0")
        load_s = time.perf_counter() - started
        driver.execute_script(COUNT_STREAM)
        time.sleep(seconds)
        updates, lines = driver.execute_script("return [window.__updates, window.__lines];")
        shown = driver.execute_script("return document.querySelectorAll('#dialogue li').length;")
        # an NPC that has spoken (the newest line's speaker), chosen as a click on its chip would
        npc = driver.execute_script("return document.querySelector('#dialogue li.npc:last-child').dataset.speaker;")
        clicked = time.perf_counter()
        driver.execute_script("choose(arguments[0]);", npc)
        wait(driver, f"document.getElementById('npc-name').textContent.includes('({npc},') && "
                     f"document.querySelector('#budget tbody tr') !== null")
        click_s = time.perf_counter() - clicked
        return {"load_s": load_s, "updates_per_s": updates / seconds, "lines_per_s": lines / seconds,
                "shown": shown, "click_s": click_s}
    finally:
        driver.quit()


async def measure(seconds: float, workdir: Path) -> tuple[list[dict[str, float]], Path]:
    """The run alone, then watched by the view on the run's loop, on its own thread, in its own process."""
    scenario = write_scenario(workdir / "big.toml", npcs=10_000, locations=100, seed=0)
    db = workdir / "big.db"
    config = RunConfig(
        scenario=str(scenario), run_id="big", ticks=1_000_000, broker=BrokerConfig(url="auto"),
        record=RecordConfig(db=str(db)),
    )
    stats, stop, ready = RunStats(), asyncio.Event(), asyncio.Event()
    started: list[RunStarted] = []
    view = LiveView()
    rows: list[dict[str, float]] = []
    async with open_view_server(build_app(view.source()), "127.0.0.1", 0) as url, asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stats=stats, stop=stop,
                                    on_ready=lambda s: (started.append(s), ready.set())))
        await ready.wait()
        await asyncio.sleep(3)
        rows.append(await _phase(stats, seconds, None, workdir / "p0"))
        address = started[0].broker.address
        feed = group.create_task(view.follow(address, "big"))
        await asyncio.sleep(3)
        rows.append(await _phase(stats, seconds, url, workdir / "p1"))
        feed.cancel()
        with open_view_thread("127.0.0.1", 0) as thread:
            thread.attach(address, "big")
            await asyncio.sleep(3)
            rows.append(await _phase(stats, seconds, thread.url, workdir / "p2"))
        port = free_port()
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "npcsim"), "view", "--broker", address.url, "--run", "big",
            "--port", str(port), stdout=asyncio.subprocess.DEVNULL,
            env={**os.environ, ENV_USERNAME: address.username or "", ENV_PASSWORD: address.password or ""})
        try:
            other = f"http://127.0.0.1:{port}/"
            for _ in range(600):
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(_get, other + "api/state")
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(3)
            rows.append(await _phase(stats, seconds, other, workdir / "p3"))
        finally:
            process.terminate()
            await process.wait()
        stop.set()
        await job
    return rows, db


async def _phase(stats: RunStats, seconds: float, url: str | None, profile: Path) -> dict[str, float]:
    tick0, inf0, t0 = stats.tick, stats.inferences, time.perf_counter()
    figures: dict[str, float] = {}
    if url is None:
        await asyncio.sleep(seconds)
    else:
        before = msgspec.json.decode(await asyncio.to_thread(_get, url + "api/state"))
        figures = await asyncio.to_thread(page_figures, url, seconds, profile)
        state = await asyncio.to_thread(_get, url + "api/state")
        after = msgspec.json.decode(state)
        figures["state_kb"] = len(state) / 1024
        figures["view_inferences"] = after["health"]["inferences"] - before["health"]["inferences"]
    elapsed = time.perf_counter() - t0
    figures |= {"ticks_per_s": (stats.tick - tick0) / elapsed, "inferences_per_s": (stats.inferences - inf0) / elapsed,
                "run_inferences": stats.inferences - inf0}
    return figures


def _get(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as response:
        return bytes(response.read())


def trace_cost(db: Path, limit: int = 5000) -> dict[str, float]:
    with open_reader(db) as reader:
        records = [r for _, r in zip(range(limit), reader.audit_records(), strict=False)]
    sizes_with, sizes_without, trace_us, record_us = [], [], [], []
    for record in records:
        started = time.perf_counter()
        payload = encode_trace(trace_of(record, shard="0", location="loc"))
        trace_us.append((time.perf_counter() - started) * 1e6)
        sizes_with.append(len(payload))
        sizes_without.append(len(encode_trace(trace_of(record, shard="0", location="loc", prompts=False))))
        started = time.perf_counter()
        encode_record(record)
        record_us.append((time.perf_counter() - started) * 1e6)
    return {"n": len(records), "trace_us": statistics.median(trace_us), "record_us": statistics.median(record_us),
            "bytes_with": statistics.mean(sizes_with), "bytes_without": statistics.mean(sizes_without)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="npcsim-bench-view-") as tmp:
        rows, db = asyncio.run(measure(args.seconds, Path(tmp)))
        cost = trace_cost(db)
    alone, same_loop, own_thread, beside = rows
    row = "| {} | {:.2f} | {} | {:.1f} | {:.0f} | {:.0f} ms | {:.2f} / {:.0f} | {:,.0f} / {:,.0f} |"
    table = "\n".join(row.format(name, r["load_s"], f"{r['state_kb']:.0f} KB", r["updates_per_s"], r["lines_per_s"],
                                 r["click_s"] * 1000, r["ticks_per_s"], r["inferences_per_s"],
                                 r["view_inferences"], r["run_inferences"])
                      for name, r in (("on the run's event loop", same_loop),
                                      ("`run --view`: own thread and loop", own_thread),
                                      ("`npcsim view`: own process", beside)))
    body = f"""Command: `.venv/bin/python benchmarks/bench_view.py --seconds {args.seconds:g}` (one shard of the
generated 10,000-NPC, 100-place world at full speed on a private Mosquitto; the page in
headless Chromium {_chromium()} through selenium {metadata.version('selenium')}, for {args.seconds:g} s
per phase). Machine: {machine_line(("msgspec", "aiohttp"))}; shared with other
engineers' test runs (load average above 10 on 2 cores), so the figures are loaded ones.

The same run, first alone ({alone['ticks_per_s']:.2f} ticks/s, {alone['inferences_per_s']:.0f} inferences/s: the peer),
then watched by the view in three ways: on the run's own event loop, on a thread with
its own loop in the run's process (what `npcsim run --view` does), and as `npcsim view`
in another process:

{HEADER}
{table}

Page load is from navigation to NPCs and dialogue on the page; the page keeps the newest
300 lines and 24 NPC chips per place. The stream sends at most 4 updates a second.

Trace topic, per inference (median over {cost['n']:,} of the run's audit records): building
and JSON-encoding the trace {cost['trace_us']:.1f} µs (encoding the audit record itself, the peer:
{cost['record_us']:.1f} µs); {cost['bytes_with']:,.0f} bytes with the prompt, {cost['bytes_without']:,.0f} bytes
with `--set record.trace_prompts=false`; one more QoS 1 publish next to the `say` line.
"""
    print(body)
    if args.write:
        write_section(args.write, "Web view and trace topic (issue 13)", body)


def _chromium() -> str:
    out = subprocess.run(["/usr/bin/chromedriver", "--version"], capture_output=True, text=True, check=False).stdout
    return out.split()[1] if len(out.split()) > 1 else "?"


if __name__ == "__main__":
    main()
