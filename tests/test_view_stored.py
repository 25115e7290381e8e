"""The stored view's model (`npcsim view --db`): what the live view shows, read from the records."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.cli import main
from sim.runner import RunConfig, run
from sim.scenario import load_scenario
from sim.store import open_reader
from sim.view import StoredRun
from tests.helpers import VILLAGE, MosquittoProcess


@pytest.fixture
async def village_db(mosquitto: MosquittoProcess, tmp_path: Path) -> Path:
    db = tmp_path / "village.db"
    await run(RunConfig(scenario=VILLAGE, broker=mosquitto.url, run_id="st", ticks=14, db=str(db)))
    return db


@pytest.mark.mosquitto
async def test_the_stored_view_reads_recipients_player_lines_and_the_shared_world(village_db: Path) -> None:
    model = StoredRun(village_db, load_scenario(VILLAGE)).model()
    world = model.world_view()
    assert world["locations"] == [{"id": "forge", "npcs": ["blacksmith"]}, {"id": "inn", "npcs": ["innkeeper"]},
                                  {"id": "square", "npcs": ["guard_captain", "snack_machine"]}]
    assert world["names"]["guard_captain"] == "Captain Mara Voss"
    assert set(world["state"]) == {"king", "mayor", "season"}  # forge, inn, curfew and stock are the NPCs' own
    lines = [(line.kind, line.speaker, line.to, line.location, line.text) for line in model.lines()]
    assert lines[:2] == [
        ("player", "player", "snack_machine", "square", "Comrade machine, the snacks belong to the people."),
        ("npc", "snack_machine", "player", "square", lines[1][4]),
    ]
    with open_reader(village_db) as reader:
        records = list(reader.audit_records())
    replies = [r for r in records if r.player_input.startswith("player: ")]
    assert sum(kind == "player" for kind, *_ in lines) == len(replies)  # one player line per answer to a player
    said = {line.inference_id: line for line in model.lines()}
    unprompted = [r for r in records if ": " not in r.player_input]  # "Ask guard_captain what news ..."
    assert unprompted
    for r in unprompted:
        named = said[r.id].to
        assert named is not None and named != r.agent_id and named in r.player_input
    npc = model.npc_view("innkeeper")
    assert npc is not None and (npc["name"], npc["location"]) == ("Tobin", "inn")
    assert npc["traces"][0]["explanation"]["dialogue"]["split"] == npc["traces"][0]["report"]["dialogue"]["budget"]


@pytest.mark.mosquitto
async def test_without_the_scenario_the_roster_is_the_ids_and_says_so(village_db: Path) -> None:
    world = StoredRun(village_db).model().world_view()
    assert world["locations"] == [{"id": "(place not stored: --scenario)",
                                   "npcs": ["blacksmith", "guard_captain", "innkeeper", "snack_machine"]}]
    assert world["names"]["snack_machine"] == "snack_machine"
    assert set(world["state"]) == {"king", "mayor", "season"}


def test_view_scenario_needs_a_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", "--broker", "mqtt://127.0.0.1:1", "--run", "r", "--scenario", "village"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--scenario: only with --db (a live run's roster comes from the run)")
