"""`npcsim memory show --db RUN.db --npc ID [--tick T]`: an NPC's working memory read back
from a recorded run, as its last inference at or before T built it; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.store import open_reader
from tests.helpers import npcsim_in_process

pytestmark = pytest.mark.mosquitto  # `--broker auto` starts Mosquitto when it is on PATH


def test_memory_show_db_picks_the_last_record_at_or_before_the_tick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "v.db"
    assert npcsim_in_process(capsys, "run", "village", "--ticks", "12", "--db", str(db), "--quiet").code == 0
    with open_reader(db) as reader:
        ticks = [s.tick for s in reader.audit_summaries("snack_machine")]
    assert len(ticks) >= 2, ticks
    for asked, expected in ((ticks[1], ticks[1]), (ticks[1] - 1, ticks[0]), (None, ticks[-1])):
        tick = [] if asked is None else ["--tick", str(asked)]
        ran = npcsim_in_process(capsys, "memory", "show", "--db", str(db), "--npc", "snack_machine", *tick, "--json")
        assert ran.code == 0, ran.err
        (shown,) = [json.loads(line) for line in ran.out.splitlines()]
        assert (shown["npc"], shown["tick"], shown["budget"]) == ("snack_machine", expected, "recorded")
        with open_reader(db) as reader:
            record = reader.latest_audit_record("snack_machine", expected)
        assert record is not None and shown["record"] == record.id and shown["prompt"] == record.memory().prompt


@pytest.mark.parametrize(("args", "message"), [
    (["village", "--db", "{db}"], "give a scenario or --db RUN.db (a run's store), not both"),
    ([], "give a scenario, or --db RUN.db for a recorded run"),
    (["--db", "{db}"], "--db {db}: name the NPC with --npc ID (repeatable)"),
    (["--db", "{db}", "--npc", "nobody"], "--npc nobody: no NPC nobody in {db}"),
    (["--db", "{db}", "--npc", "snack_machine", "--tick", "0"],
     "--npc snack_machine: snack_machine had not spoken by tick 0 in {db} (its first inference: tick 2)"),
    (["--db", "{db}", "--npc", "innkeeper"], "--npc innkeeper: innkeeper never spoke in {db} (no inference recorded)"),
    (["--db", "{db}", "--npc", "snack_machine", "--tight", "500", "--set", "memory.selection=scored"],
     "--tight, --set: with a scenario only; --db shows the working memory the run built "
     "(npcsim replay --set ... asks what another would have said)"),
    (["village", "--tick", "3"], "--tick: with --db only (a scenario's memory is that of its first tick)"),
])
def test_memory_show_db_refuses_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    db = tmp_path / "v.db"
    assert npcsim_in_process(capsys, "run", "village", "--ticks", "3", "--db", str(db), "--quiet").code == 0
    ran = npcsim_in_process(capsys, "memory", "show", *(a.replace("{db}", str(db)) for a in args))
    assert (ran.code, ran.out) == (2, "")
    assert ran.err == f"npcsim: error: {message.replace('{db}', str(db))}\n"
