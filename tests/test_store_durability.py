"""Durability: a writing process stopped by SIGTERM, Ctrl-C (SIGINT) or SIGKILL.

`tests/store_writer.py` runs as a child process; it prints each tick it queued and each
tick whose commit returned. After the signal the database must pass
`PRAGMA integrity_check`, hold every printed committed tick, and no tick half-written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sim.store import open_reader

SCRIPT = Path(__file__).with_name("store_writer.py")
AGENTS = 20
ROWS = 5
PER_TICK = AGENTS * ROWS
READY_TICK = 20


@contextmanager
def writer_process(db: Path) -> Iterator[tuple[subprocess.Popen[str], list[str], threading.Event]]:
    """The child, the lines it printed so far, and an event set once READY_TICK is committed."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(db), str(AGENTS), str(ROWS)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == f"committed {READY_TICK}":
                ready.set()
        ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        yield proc, lines, ready
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        reader.join(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


def ticks(lines: list[str], word: str) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith(word + " ")]


def rows_per_tick(db: Path) -> dict[int, int]:
    with open_reader(db) as reader:
        assert reader.integrity_check() == "ok"
        rows = reader._query("SELECT tick, sum(length(items) / 8) FROM heard GROUP BY tick")
    return {int(t): int(n) for t, n in rows}  # type: ignore[call-overload]


def test_sigkill_keeps_every_committed_tick_and_nothing_half_written(tmp_path: Path) -> None:
    db = tmp_path / "shard.db"
    with writer_process(db) as (proc, lines, ready):
        assert ready.wait(timeout=15), f"the writer never reached the ready tick: {lines}"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    committed = ticks(lines, "committed")
    assert len(committed) >= READY_TICK
    on_disk = rows_per_tick(db)
    for tick in committed:
        assert on_disk.get(tick) == PER_TICK, f"committed tick {tick} is not whole on disk"
    assert all(n == PER_TICK for n in on_disk.values()), f"a half-written tick is visible: {on_disk}"
    with open_reader(db) as reader:
        last = reader.last_tick()
    assert last is not None and last >= committed[-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_flush_everything_and_exit_0(tmp_path: Path, sig: signal.Signals) -> None:
    db = tmp_path / "shard.db"
    with writer_process(db) as (proc, lines, ready):
        assert ready.wait(timeout=15), f"the writer never reached the ready tick: {lines}"
        proc.send_signal(sig)
        assert proc.wait(timeout=15) == 0
    assert lines[-1] == "stopped"
    queued = ticks(lines, "queued")
    on_disk = rows_per_tick(db)
    for tick in queued:
        assert on_disk.get(tick) == PER_TICK, f"queued tick {tick} was not flushed"
    assert not Path(f"{db}-wal").exists(), "the store was not closed cleanly"
    assert os.path.getsize(db) > 0
