"""A store has one writer at a time and belongs to one run: the lock and the run identity in the store."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sim.errors import StoreError
from sim.store import RunIdentity, Writer, open_reader, open_store
from tests.store_states import village_state as state

IDENTITY = RunIdentity(run_id="village-7", seed=7, scenario="village", scenario_sha256="ab" * 32, shard="0/1",
                       nonce="cd" * 16)


async def test_a_second_writer_is_refused_naming_the_first_and_readers_go_on(tmp_path: Path) -> None:
    db = tmp_path / "tw.db"
    async with open_store(db) as store:
        await store.ensure_agent(state(), writer=Writer.SCENARIO)
        await store.end_tick(0)
        with pytest.raises(StoreError) as refused:
            async with open_store(db):
                pass
        message = str(refused.value)
        assert "\n" not in message and f"pid {os.getpid()}" in message and "in use by another writer" in message
        assert "pytest" in message  # the holder's command line
        with open_reader(db) as reader:  # audit, view and replay read on
            assert reader.last_tick() == 0
        await store.end_tick(1)  # the first writer is not disturbed
    assert not (tmp_path / "tw.db.lock").exists()
    async with open_store(db) as again:  # the lock went with its holder
        assert again.last_tick == 1


def test_a_killed_writer_leaves_no_lock_behind(tmp_path: Path) -> None:
    db = tmp_path / "killed.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import asyncio, sys\n"
            "from sim.store import open_store\n"
            "async def main():\n"
            f"    async with open_store({str(db)!r}):\n"
            "        print('locked', flush=True)\n"
            "        await asyncio.sleep(600)\n"
            "asyncio.run(main())\n"
        )],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        with pytest.raises(StoreError, match=f"pid {holder.pid}"):

            async def second() -> None:
                async with open_store(db):
                    pass

            asyncio.run(second())
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert (tmp_path / "killed.db.lock").exists()  # left behind by kill -9, and harmless:

    async def take_over() -> bool:
        async with open_store(db) as store:
            return store.last_tick is None

    assert asyncio.run(take_over())


async def test_the_identity_is_kept_and_read_back(tmp_path: Path) -> None:
    db = tmp_path / "id.db"
    async with open_store(db) as store:
        assert store.identity is None
        await store.keep_identity(IDENTITY)
        assert store.identity == IDENTITY
    async with open_store(db) as store:
        assert store.identity == IDENTITY
    with open_reader(db) as reader:
        assert reader.run_identity() == IDENTITY
    with sqlite3.connect(db) as conn:  # documented, and readable without npcsim
        (text,) = conn.execute("SELECT json_extract(identity, '$.run_id') FROM run").fetchone()
    conn.close()
    assert text == "village-7"
    assert IDENTITY.describe() == "run village-7 seed 7 (shard 0/1)"
    described = IDENTITY.describe(scenario=True)
    assert described == "run village-7 seed 7 (shard 0/1) of scenario village (sha256 abababababab)"


async def test_a_store_no_run_has_claimed_has_no_identity(tmp_path: Path) -> None:
    db = tmp_path / "unclaimed.db"
    async with open_store(db) as store:
        await store.ensure_agent(state(), writer=Writer.SCENARIO)
        await store.end_tick(0)
    with open_reader(db) as reader:
        assert reader.run_identity() is None
    async with open_store(db) as store:
        assert store.identity is None and store.last_tick == 0
