"""`npcsim audit replay --jobs N`: worker processes over record ranges, the same bytes out as one process."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import msgspec
import pytest

from sim.audit import encode_record
from sim.cli import main
from sim.replay import plan_spans
from sim.store import Writer, open_reader, open_store
from tests.audit_records import AGENTS, random_record

RECORDS = 600


@pytest.fixture
async def audit_db(tmp_path: Path) -> Path:
    db = tmp_path / "audit.db"
    rng = random.Random(5)
    async with open_store(db) as store:
        for n in range(RECORDS):
            record = random_record(rng, n)
            if n % AGENTS == 0:
                await store.end_tick(record.tick)
            await store.ensure_agent(record.state, writer=Writer.SCENARIO)
            await store.record(record)
    return db


def replay_output(db: Path, jobs: int, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["audit", "replay", "--db", str(db), "--jobs", str(jobs)])
    return code, capsys.readouterr().out


def alter(db: Path, record_id: str) -> None:
    """Store the record with a budget it was not built with: its replay differs."""
    with open_reader(db) as reader:
        record = reader.audit_record(record_id)
    config = msgspec.structs.replace(record.config, max_context_chars=record.report.prompt_chars - 40)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE audit SET record = ?, format = 1 WHERE id = ?",
                     (encode_record(msgspec.structs.replace(record, config=config)), record_id))
    conn.close()


async def test_two_processes_print_what_one_prints(audit_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert len(plan_spans([str(audit_db)], 2).spans) > 2  # the records are really split
    one = replay_output(audit_db, 1, capsys)
    # random records hold no attempts
    assert one == (0, f"replayed {RECORDS} records: all byte-identical (0 attempts checked)\n")
    assert replay_output(audit_db, 2, capsys) == one
    # two drifts in different spans: the count is of both, the first is reported, as one process does
    alter(audit_db, "inf-00450")
    alter(audit_db, "inf-00120")
    one = replay_output(audit_db, 1, capsys)
    assert one[0] == 1 and f"replayed {RECORDS} records: 2 differ" in one[1]
    assert "first difference: record inf-00120" in one[1]
    assert replay_output(audit_db, 2, capsys) == one
    assert replay_output(audit_db, 3, capsys) == one


def test_jobs_below_one_is_refused(audit_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "replay", "--db", str(audit_db), "--jobs", "0"]) == 2
    assert "--jobs must be >= 1, got 0" in capsys.readouterr().err


def test_spans_are_whole_ticks_in_order_and_cover_every_record(audit_db: Path) -> None:
    with open_reader(audit_db) as reader:
        ticks = [s.tick for s in reader.audit_summaries()]
    plan = plan_spans([str(audit_db)], 2)
    assert plan.records == RECORDS
    covered = [t for span in plan.spans for t in ticks if span.from_tick <= t <= span.to_tick]
    assert covered == ticks
    assert all(a.to_tick < b.from_tick for a, b in zip(plan.spans, plan.spans[1:], strict=False))
