"""Two real llama.cpp servers, one killed (SIGKILL) with a request in flight: the run goes on,
and every NPC is answered by the other from then on, and no line falls back for want of a server."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest

from sim.inference.backends.spread import rendezvous_order
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader
from tests.helpers import VILLAGE, MosquittoProcess, eventually
from tests.llama_server import SLOTS, LlamaServer, require_llama_server

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow, pytest.mark.timeout(900)]

TICKS = 16


def busy(server: LlamaServer) -> bool:
    """A slot of `server` is serving a request now."""
    try:
        slots = httpx.get(f"{server.root}/slots", timeout=1.0).json()
    except httpx.HTTPError:
        return False
    return any(slot.get("is_processing") for slot in slots)


async def test_a_llama_server_killed_mid_run_leaves_every_npc_to_the_other(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    binary, model = require_llama_server()
    first = LlamaServer(binary, model, tmp_path / "first.log")
    try:
        second = LlamaServer(binary, model, tmp_path / "second.log")
        try:
            await run_and_kill(first, second, mosquitto, tmp_path / "two.db")
        finally:
            second.stop()
    finally:
        first.stop()


async def run_and_kill(first: LlamaServer, second: LlamaServer, mosquitto: MosquittoProcess, db: Path) -> None:
    urls = [first.base_url, second.base_url]
    # The victim is the snack machine's own server: the NPC the village's player talks to
    # first (tick 1) and again later (ticks 3, 5 and 13), whatever the servers' ports.
    victim, survivor = (
        (first, second) if rendezvous_order("snack_machine", urls)[0] == first.base_url else (second, first)
    )
    options = {"base_url": urls, "model": "smollm2", "endpoint": "completions", "max_tokens": 16,
               "temperature": 0.0, "read_timeout": 100.0}
    config = RunConfig(
        scenario=VILLAGE, run_id="two-llama", ticks=TICKS, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
        inference=InferenceConfig(backend="openai", backend_options=options, concurrency=SLOTS,
                                  inference_timeout=120.0, placement="in-process"),
    )
    stats = RunStats()
    running = asyncio.create_task(run(config, stats=stats))
    try:
        await eventually(lambda: asyncio.to_thread(busy, victim), what="a request in the victim's slots", every=0.05,
                         within=300)
    except BaseException:
        running.cancel()
        raise
    victim.proc.send_signal(signal.SIGKILL)
    killed_at = stats.tick
    await running
    assert stats.ticks_done == TICKS and killed_at < TICKS - 4
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    # A reply the small model cut short may be rejected (its reason "rejected"); no server failure is a fallback.
    failures = [r.fallback_reason for r in records if r.fallback and r.fallback_reason != "rejected"]
    assert records and not failures, failures
    later = [r for r in records if r.tick > killed_at]
    servers = {r.attempts[-1].served_by.server for r in later if r.attempts[-1].served_by is not None}
    assert servers == {survivor.base_url}, servers
    assert len(later) == sum(1 for r in later if r.attempts[-1].served_by is not None)
    # NPCs whose own server was the victim spoke after the kill, answered by the survivor.
    assert any(rendezvous_order(r.agent_id, urls)[0] == victim.base_url for r in later)
