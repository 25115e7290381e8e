"""sim.audit and `npcsim audit`: record, replay byte for byte, detect drift, read-only CLI."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from sim.audit import AuditRecord, decode_record, encode_record, replay
from sim.cli import main
from sim.replay import plan_spans
from sim.store import Writer, open_reader, open_store
from tests.audit_records import AGENTS, random_record, store_instead
from tests.helpers import fingerprint

RECORDS = 1_000


@pytest.fixture
async def audit_db(tmp_path: Path) -> Path:
    """A store holding 1,000 recorded inferences of 25 agents."""
    db = tmp_path / "audit.db"
    rng = random.Random(3)
    async with open_store(db) as store:
        for n in range(RECORDS):
            record = random_record(rng, n)
            if n % AGENTS == 0:
                await store.end_tick(record.tick)
            await store.ensure_agent(record.state, writer=Writer.SCENARIO)
            await store.record(record)
    return db


def test_record_round_trips_and_replays() -> None:
    record = random_record(random.Random(1), 0)
    again = decode_record(encode_record(record))
    assert again == record
    result = replay(again)
    assert result.ok and result.prompt_sha256 == record.prompt_sha256 and result.difference == ""


def test_replay_names_the_drift() -> None:
    record = random_record(random.Random(2), 0)
    tight = msgspec.structs.replace(record, config=msgspec.structs.replace(record.config, max_context_chars=100))
    result = replay(tight)
    assert not result.ok
    assert "--- recorded prompt" in result.difference and "+++ rebuilt prompt" in result.difference
    # without an attempt (no call was made), the hashes are what is compared
    result = replay(msgspec.structs.replace(tight, attempts=()))
    assert not result.ok and result.difference.startswith("prompt_sha256: recorded")
    # an edited prompt no longer matches what the record rebuilds
    attempt = msgspec.structs.replace(record.attempts[0], prompt=record.attempts[0].prompt + "x")
    assert "attempt 1 differs" in replay(msgspec.structs.replace(record, attempts=(attempt,))).difference
    # a changed report alone is caught too
    report = msgspec.structs.replace(record.report, mandatory_chars=record.report.mandatory_chars + 1)
    assert "report.mandatory_chars" in replay(msgspec.structs.replace(record, report=report)).difference


async def test_replay_of_1000_recorded_inferences_is_byte_exact(
    audit_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = fingerprint(audit_db)
    assert main(["audit", "replay", "--db", str(audit_db)]) == 0
    assert f"replayed {RECORDS} records: all byte-identical" in capsys.readouterr().out
    assert main(["audit", "replay", "--db", str(audit_db), "--agent", "npc3"]) == 0
    assert f"replayed {RECORDS // AGENTS} records" in capsys.readouterr().out
    assert fingerprint(audit_db) == before, "auditing changed the database file"


async def test_a_changed_config_makes_replay_exit_1(audit_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with open_reader(audit_db) as reader:
        record = reader.audit_record("inf-00500")
    config = msgspec.structs.replace(record.config, max_context_chars=record.report.prompt_chars - 40)
    changed = msgspec.structs.replace(record, config=config)
    store_instead(audit_db, changed)
    assert main(["audit", "replay", "--db", str(audit_db)]) == 1
    out = capsys.readouterr().out
    assert f"replayed {RECORDS} records: 1 differ" in out
    assert "first difference: record inf-00500" in out
    assert "recorded prompt" in out and "rebuilt prompt" in out


async def test_list_show_and_export(audit_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = fingerprint(audit_db)
    assert main(["audit", "list", "--db", str(audit_db), "--agent", "npc7"]) == 0
    listed = capsys.readouterr()
    out = listed.out
    assert "inf-00007" in out and "inf-00008" not in out and f"{RECORDS // AGENTS} records" in listed.err
    assert len(out.splitlines()) == RECORDS // AGENTS  # in a pipe: one record per line, nothing else

    assert main(["audit", "show", "--db", str(audit_db), "inf-00042"]) == 0
    out = capsys.readouterr().out
    with open_reader(audit_db) as reader:
        record = reader.audit_record("inf-00042")
    [attempt] = record.attempts
    assert attempt.raw_response is not None
    assert attempt.raw_response in out and "replay identical" in out and "episodic" in out
    for line in attempt.prompt.splitlines():
        assert line.strip() in out
    shown = record.explanation().dropped()
    assert f"dropped ({len(shown)})" in out and shown and shown[0].text.split()[0] in out
    assert f"{record.config.selection} selection, limit {record.config.max_context_chars} chars" in out

    target = tmp_path / "export.jsonl"
    assert main(["audit", "export", "--db", str(audit_db), "--out", str(target)]) == 0
    decoder = msgspec.json.Decoder(AuditRecord)
    exported = [decoder.decode(line) for line in target.read_bytes().splitlines()]
    assert len(exported) == RECORDS
    assert all(replay(r).ok for r in exported[:50])
    rows = [msgspec.json.decode(line) for line in target.read_bytes().splitlines()]
    for row, r in zip(rows, exported, strict=True):
        assert all(set(d) == {"category", "tick", "text", "reason"} for d in row["dropped"])
        assert row["report"]["selection"] == r.report.selection == r.config.selection
        assert {d["reason"] for d in row["dropped"]} <= {"cap", "budget", "over_budget"}
        for name in ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs"):
            assert sum(d["category"] == name for d in row["dropped"]) == getattr(r.report, name).dropped
    assert sum(len(row["dropped"]) for row in rows) > RECORDS  # truncation dropped things: the test sees them
    assert {row["report"]["selection"] for row in rows} == {"recency", "scored"}
    assert fingerprint(audit_db)[0] == before[0]


def test_cli_refuses_missing_and_foreign_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database at all, just some words\n" * 5)
    before = fingerprint(notes)
    assert main(["audit", "replay", "--db", str(notes)]) == 2
    assert "not an SQLite database" in capsys.readouterr().err
    assert fingerprint(notes) == before
    assert main(["audit", "list", "--db", str(tmp_path / "missing.db")]) == 2
    assert "no such database file" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()


# --- npcsim audit replay --jobs N: worker processes over record ranges, the same bytes as one process


def replay_output(db: Path, jobs: int, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["audit", "replay", "--db", str(db), "--jobs", str(jobs)])
    return code, capsys.readouterr().out


def alter(db: Path, record_id: str) -> None:
    """Store the record with a budget it was not built with: its replay differs."""
    with open_reader(db) as reader:
        record = reader.audit_record(record_id)
    config = msgspec.structs.replace(record.config, max_context_chars=record.report.prompt_chars - 40)
    store_instead(db, msgspec.structs.replace(record, config=config))


async def test_two_processes_print_what_one_prints(audit_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert len(plan_spans([str(audit_db)], 2).spans) > 2  # the records are really split
    one = replay_output(audit_db, 1, capsys)
    # random records hold one attempt each
    assert one == (0, f"replayed {RECORDS} records: all byte-identical ({RECORDS} attempts checked)\n")
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
