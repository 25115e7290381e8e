"""The fault harness (tests/faults): its schedules' properties, and a fixed set of seeds run for real.

The generator is pure, so its properties are checked on many seeds (hypothesis); the fixed
seeds below each run a schedule against real processes (Mosquitto, `npcsim run` shards, a
network namespace, the fault proxy, the fake model server) and must pass every check of
tests/faults/runner.py. The other seeds are the soak: `make faults SEEDS=50`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.faults.__main__ import seeds
from tests.faults.network import Netns, fault_proxy, netns
from tests.faults.runner import run_schedule
from tests.faults.schedule import (
    FIRST,
    GAP,
    MAX_DURATION_S,
    MODEL,
    PARTITION,
    PROXY_RESET,
    PROXY_STALL,
    SHARD_KILL,
    TAIL,
    WORKER_KILL,
    draw,
)
from tests.helpers import require_mosquitto

SEEDS = st.integers(min_value=0, max_value=2**32)
NETWORK = (PARTITION, PROXY_RESET, PROXY_STALL)


@given(SEEDS)
def test_a_seed_gives_one_schedule(seed: int) -> None:
    assert draw(seed) == draw(seed)
    assert draw(seed).describe() == draw(seed).describe()


@given(SEEDS, st.sampled_from(["village", "generated", None]), st.sampled_from([1, 2, 3, None]))
def test_the_faults_fall_within_the_run_and_are_bounded(seed: int, world: str | None, shards: int | None) -> None:
    s = draw(seed, world=world, shards=shards)
    assert (world or s.world) == s.world and (shards or s.shards) == s.shards
    assert 1 <= s.shards <= 3 and s.world in ("village", "generated")
    assert s.faults, "every schedule injects something"
    for fault in s.faults:
        assert FIRST <= fault.tick < s.ticks - TAIL, fault
        assert 0 <= fault.duration_s <= MAX_DURATION_S, fault
        assert 0 <= fault.target < s.shards, fault
    for tick in [i.tick for i in s.inputs] + [w.tick for w in s.world_changes]:
        assert 1 <= tick < s.ticks - TAIL, s


@given(SEEDS)
def test_the_faults_never_overlap_in_a_way_the_runner_cannot_do(seed: int) -> None:
    s = draw(seed)
    starts = [f.tick for f in s.faults]
    assert all(b - a >= GAP for a, b in itertools.pairwise(starts)), starts  # one after another
    kinds = {f.kind for f in s.faults}
    assert not (PARTITION in kinds and kinds & {PROXY_RESET, PROXY_STALL}), kinds  # the namespace or the proxy
    if kinds & set(MODEL):  # the model server is on loopback: no namespace, no proxy, no workers
        assert not kinds & {*NETWORK, WORKER_KILL}, kinds
    assert len({f.target for f in s.faults if f.kind in NETWORK}) <= 1, s.faults  # one shard behind them
    assert (s.workers > 0) == (WORKER_KILL in kinds)


@given(SEEDS)
def test_every_shard_kill_has_inputs_in_its_tick(seed: int) -> None:
    s = draw(seed)
    kills = [f.tick for f in s.faults if f.kind == SHARD_KILL]
    assert sorted(kills) == sorted(i.tick for i in s.inputs if i.player.startswith("k") and i.player.endswith("b"))
    assert sorted(t - 1 for t in kills) == sorted(i.tick for i in s.inputs if i.player.startswith("k")
                                                  and i.player.endswith("a"))
    assert len({i.text for i in s.inputs}) == len(s.inputs), "each input is told apart by its text"


def test_seeds_are_counts_lists_and_ranges() -> None:
    assert seeds(["3"]) == [1, 2, 3]
    assert seeds(["4", "9"]) == [4, 9]
    assert seeds(["2-4", "7"]) == [2, 3, 4, 7]


# A broker kill (village, 3 shards), a partition (generated, 1 shard), the proxy's stalls on
# a slow link (generated, 3) and its reset (village, 3), a slow and a hanging model server
# (village, 2), model-server 500s (generated, 3), two shard kills -9 with input published in
# the killed ticks (generated, 2), a remote worker killed mid-inference (village, 2): about
# four minutes. NPCSIM_FAULT_SEEDS="..." runs others.
FIXED = [int(s) for s in os.environ.get("NPCSIM_FAULT_SEEDS", "3 6 17 22 46 26 4 12").split()]


@pytest.mark.mosquitto
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", FIXED)
async def test_a_fixed_schedule_holds(seed: int, tmp_path: Path) -> None:
    require_mosquitto()
    schedule = draw(seed)
    if schedule.netns and os.geteuid() != 0:
        pytest.skip("a partition needs root (ip netns)")
    outcome = await run_schedule(schedule, tmp_path)
    assert outcome.ok, f"{schedule.describe()}\n" + "\n".join(f"  - {p}" for p in outcome.problems)
    assert outcome.faults == len(schedule.faults)


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="a network namespace needs root and ip")
def test_the_namespace_and_its_veth_pair_are_removed_even_on_failure() -> None:
    def connect_from_inside(ns: Netns, port: int) -> subprocess.CompletedProcess[bytes]:
        code = f"import socket; socket.create_connection(({ns.host_addr!r}, {port}), timeout=1).close()"
        return subprocess.run([*ns.wrap, sys.executable, "-c", code], capture_output=True, timeout=30)

    with pytest.raises(RuntimeError, match="the schedule failed"), netns(249) as ns:
        assert ns.name in _namespaces()
        with socket.create_server((ns.host_addr, 0)) as listener:
            port = listener.getsockname()[1]
            joined = connect_from_inside(ns, port)
            assert joined.returncode == 0, joined.stderr  # the veth pair joins the namespaces
            ns.link(up=False)
            cut = connect_from_inside(ns, port)
            assert cut.returncode != 0 and b"timed out" in cut.stderr  # the partition
            ns.link(up=True)  # a link brought up takes a moment to carry traffic (longer on a busy machine)
            assert any(connect_from_inside(ns, port).returncode == 0 for _ in range(10)), "the link never came back"
        raise RuntimeError("the schedule failed")
    assert ns.name not in _namespaces()
    assert subprocess.run(["ip", "link", "show", ns.host_if], capture_output=True).returncode != 0


async def test_the_fault_proxy_passes_delays_stalls_and_resets() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(100):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    async with server, fault_proxy(server.sockets[0].getsockname()[1]) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"one")
        assert await asyncio.wait_for(reader.read(100), 5) == b"one"
        stalled = asyncio.create_task(proxy.stall(0.5))
        await asyncio.sleep(0)  # the stall begins
        writer.write(b"two")
        echoed = asyncio.create_task(reader.read(100))
        done, _ = await asyncio.wait({echoed}, timeout=0.2)
        assert not done, "bytes passed a stalled proxy"
        await stalled
        assert await asyncio.wait_for(echoed, 5) == b"two"
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            writer.write(b"three")
            await writer.drain()
            if not await asyncio.wait_for(reader.read(100), 5):
                raise ConnectionResetError("closed")
        writer.close()
        assert proxy.resets == 1
