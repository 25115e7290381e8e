"""The pool's worker process (transport "process"): served as in process, restarted when it
dies, ended with its pool or its shard, a clear error when it cannot start."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

import psutil
import pytest

from sim.cli import build_parser
from sim.cli.run import run_command
from sim.errors import ConfigError
from sim.inference import InferenceRequest, InferenceResult, PoolConfig, open_pool
from sim.shard import InferenceConfig, Placement, RunConfig
from sim.shard._run_config import WORKER_PROCESS_NPCS, pool_transport
from tests.helpers import eventually
from tests.inference_helpers import make_request

WORKER = "sim.inference._local_worker"


def workers() -> list[psutil.Process]:
    """This process's worker processes (children running the worker module)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if WORKER in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def unread(process: psutil.Process) -> int:
    """The bytes waiting in a process's stdin pipe: 0 once it has read every frame sent to it."""
    fd = os.open(f"/proc/{process.pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])
    finally:
        os.close(fd)


def requests(n: int) -> list[InferenceRequest]:
    said = ("traveller: Is the bridge safe to cross?", "traveller: Who is the mayor?", "Well, hello there.",
            "guard: The bridge is not broken!", "traveller: Tell me about the miller.")
    return [make_request(i, agent=f"npc{i % 7}", said=said[i % len(said)]) for i in range(n)]


def essence(results: list[InferenceResult]) -> list[tuple[object, ...]]:
    """What a result says, without its timings and worker name."""
    return [(r.id, r.line, r.fallback, r.fallback_reason, r.attempts, r.raw_response) for r in results]


async def serve_all(config: PoolConfig, batch: list[InferenceRequest]) -> list[InferenceResult]:
    async with open_pool(config) as pool:
        return list(await asyncio.gather(*(pool.infer(r) for r in batch)))


async def test_a_worker_process_answers_as_the_pool_in_process_does() -> None:
    batch = requests(60)
    here = await serve_all(PoolConfig(concurrency=8), batch)
    config = PoolConfig(concurrency=8, transport="process")
    async with open_pool(config) as pool:
        assert len(workers()) == 1
        there = list(await asyncio.gather(*(pool.infer(r) for r in batch)))
        statistics = pool.statistics()
    assert essence(there) == essence(here)
    assert {r.worker for r in there} == {"process"} and not any(r.fallback for r in there)
    assert statistics.completed == 60 and statistics.in_flight == 0 and statistics.in_flight_peak == 8
    assert workers() == []  # it ended with its pool


async def test_rejected_outputs_are_counted_as_in_process() -> None:
    batch = [make_request(i, said="guard: The bridge is not broken!") for i in range(5)]
    options = {"script": ["The old bridge is not broken.", "Aye, the bridge is down."]}
    counts = []
    for transport in ("inprocess", "process"):
        async with open_pool(PoolConfig(transport=transport, options=options)) as pool:  # type: ignore[arg-type]
            for request in batch:
                await pool.infer(request)
            counts.append(pool.statistics().rejected_outputs)
    assert counts[0] == counts[1] > 0


async def test_a_killed_worker_process_is_started_again_and_no_request_is_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = requests(16)
    here = await serve_all(PoolConfig(concurrency=8), batch)
    config = PoolConfig(concurrency=8, transport="process", options={"delay_ms": 1000})
    async with open_pool(config) as pool:
        [first] = workers()
        serving = asyncio.gather(*(pool.infer(r) for r in batch))
        await eventually(lambda: pool.statistics().in_flight == 8, what="eight requests in flight")
        await asyncio.sleep(0)  # a yield: the pool writes the frame it queued
        await eventually(lambda: unread(first) == 0, what="the worker reading them: it holds them now")
        first.kill()
        with caplog.at_level(logging.WARNING):
            there = list(await serving)
        assert [w.pid for w in workers()] != [first.pid] and len(workers()) == 1
    assert essence(there) == essence(here)  # every request answered, as if nothing had happened
    assert "starting it again and sending it the 8 requests it held" in caplog.text


async def test_a_worker_process_that_keeps_dying_leaves_the_fallback_lines(caplog: pytest.LogCaptureFixture) -> None:
    config = PoolConfig(transport="process", fact_guard="tests.dying_guard:always")
    with caplog.at_level(logging.WARNING):
        async with open_pool(config) as pool:
            results = await asyncio.gather(*(pool.infer(r) for r in requests(3)))
            later = await pool.infer(make_request(99))
    assert all(r.fallback and r.fallback_reason == "backend_error" for r in [*results, later])
    assert "every request gets its fallback line" in caplog.text


async def test_one_death_costs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "die"
    marker.touch()
    monkeypatch.setenv("NPCSIM_TEST_DIE_ONCE", str(marker))
    batch = requests(10)
    here = await serve_all(PoolConfig(), batch)
    there = await serve_all(PoolConfig(transport="process", fact_guard="tests.dying_guard:once"), batch)
    assert not marker.exists()  # a worker died on it
    assert essence(there) == essence(here)


async def test_a_backend_that_cannot_open_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"worker process could not start: .*bogus"):
        async with open_pool(PoolConfig(transport="process", options={"bogus": 1})):
            pass
    assert workers() == []


def test_the_worker_process_ends_when_its_shard_is_killed(tmp_path: Path) -> None:
    code = (
        "import asyncio, os, sys\n"
        "from sim.inference import PoolConfig, open_pool\n"
        "async def main():\n"
        "    async with open_pool(PoolConfig(transport='process')):\n"
        "        print('open', flush=True)\n"
        "        await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as shard:
        try:
            assert shard.stdout is not None and shard.stdout.readline().strip() == "open"
            [worker] = [p for p in psutil.Process(shard.pid).children() if WORKER in " ".join(p.cmdline())]
            shard.kill()
            shard.wait(10)
            worker.wait(10)  # raises psutil.TimeoutExpired if the worker outlives its shard
        finally:
            shard.kill()


def test_which_shards_serve_in_a_worker_process(monkeypatch: pytest.MonkeyPatch) -> None:
    config = RunConfig(scenario="x.toml")
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    assert pool_transport(config, WORKER_PROCESS_NPCS) == "process"
    assert pool_transport(config, WORKER_PROCESS_NPCS - 1) == "inprocess"

    def placed(placement: Placement) -> RunConfig:
        return RunConfig(scenario="x.toml", inference=InferenceConfig(placement=placement))

    assert pool_transport(placed("process"), 3) == "process"
    assert pool_transport(placed("in-process"), 10**6) == "inprocess"
    assert pool_transport(placed("remote"), 10**6) == "mqtt"
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0})
    assert pool_transport(config, 10**6) == "inprocess"  # one CPU: nothing to gain
    with pytest.raises(ConfigError, match=r"--remote-workers and --set inference\.placement=process"):
        run_command(build_parser().parse_args(["run", "x.toml", "--remote-workers",
                                               "--set", "inference.placement=process"]))

