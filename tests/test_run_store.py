"""A run keeps its state and audit in SQLite: replay is byte-exact, --resume continues."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import ConfigError
from sim.runner import RunConfig, run
from sim.store import open_reader
from tests.conftest import REPO, MosquittoProcess

pytestmark = pytest.mark.mosquitto
VILLAGE = str(REPO / "scenarios" / "village.toml")


async def test_run_records_every_inference_and_resumes(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    db = tmp_path / "village.db"
    config = RunConfig(scenario=VILLAGE, broker=mosquitto.url, run_id="kept", ticks=8, db=str(db))
    first = await run(config)
    assert first.inferences > 0
    with open_reader(db) as reader:
        assert reader.last_tick() == 7
        assert len(reader.audit_summaries()) == first.inferences

    with pytest.raises(ConfigError, match=r"already holds this run up to tick 7: pass --resume"):
        await run(config)

    second = await run(RunConfig(scenario=VILLAGE, broker=mosquitto.url, run_id="kept", ticks=6, db=str(db),
                                 resume=True))
    assert (second.first_tick, second.tick) == (8, 13)
    with open_reader(db) as reader:
        assert reader.last_tick() == 13
        assert len(reader.audit_summaries()) == first.inferences + second.inferences
        smith = [r for r in reader.audit_records("snack_machine")]
    assert smith and all("capitalist snack machine" in (r.prompt or "") for r in smith)
    assert main(["audit", "replay", "--db", str(db)]) == 0


async def test_resume_without_a_database_is_refused(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--resume: .* holds no committed tick"):
        await run(RunConfig(scenario=VILLAGE, broker=mosquitto.url, ticks=2, db=str(tmp_path / "new.db"),
                            resume=True))
