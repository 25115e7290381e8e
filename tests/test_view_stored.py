"""The stored view's model (`npcsim view --db`): what the live view shows, read from the records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.cli import main
from sim.scenario import load_scenario
from sim.shard import BrokerConfig, RecordConfig, RunConfig, run
from sim.store import open_reader
from sim.view import StoreComparison, StoredRun, ViewSource, build_app, open_view_server
from tests.helpers import VILLAGE, MosquittoProcess


@pytest.fixture
async def village_db(mosquitto: MosquittoProcess, tmp_path: Path) -> Path:
    db = tmp_path / "village.db"
    await run(RunConfig(
        scenario=VILLAGE, run_id="st", ticks=14, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    ))
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


async def two_budgets(mosquitto: MosquittoProcess, tmp_path: Path) -> tuple[Path, Path]:
    """The same village run twice: at the scenario's budget and at 700 characters."""
    dbs = (tmp_path / "wide.db", tmp_path / "tight.db")
    for db, memory in zip(dbs, ({}, {"max_context_chars": 700}), strict=True):
        await run(RunConfig(
            scenario=VILLAGE, run_id="cmp", ticks=12, broker=BrokerConfig(url=mosquitto.url),
            memory=memory, record=RecordConfig(db=str(db)),
        ))
    return dbs


def newest_memory_items(db: Path, agent: str) -> dict[str, list[str]]:
    """The newest record's working memory of `agent`, item texts by category, rebuilt here."""
    with open_reader(db) as reader:
        memory = list(reader.audit_records(agent))[-1].memory()
    return {
        "beliefs": [b.text for b in memory.beliefs],
        "episodic": [f"[tick {e.tick}] {e.text}" for e in memory.episodic],
        "dialogue": [f"{line.speaker}: {line.text}" for line in memory.dialogue],
    }


def marked(side: dict[str, Any], mark: str) -> dict[str, list[str]]:
    return {c: [i["text"] for i in side["categories"][c] if i["mark"] == mark] for c in ("beliefs", "episodic",
                                                                                        "dialogue")}


@pytest.mark.mosquitto
async def test_compare_serves_both_memories_with_what_the_other_lost_and_gained(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    wide, tight = await two_budgets(mosquitto, tmp_path)
    stored = StoredRun(wide)
    comparison = StoreComparison(wide, tight)
    source = ViewSource(model=stored.model, live=False, ticks=(stored.first_tick, stored.last_tick),
                        compare=comparison.compare, compare_name=comparison.other_name)
    async with open_view_server(build_app(source), "127.0.0.1", 0) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/api/state")).json()["compare"] == "tight.db"
        sides = (await client.get("/api/compare/snack_machine")).json()
        missing = await client.get("/api/compare/nobody")
        early = (await client.get("/api/compare/snack_machine", params={"tick": 0})).json()
    assert missing.status_code == 404 and "no NPC 'nobody'" in missing.json()["error"]
    assert early["this"]["record"] is None and early["other"]["record"] is None  # it had not spoken by tick 0
    this, other = newest_memory_items(wide, "snack_machine"), newest_memory_items(tight, "snack_machine")
    assert sides["this"]["limit_chars"] > 700 and sides["other"]["limit_chars"] == 700
    assert sides["this"]["selection"] == sides["other"]["selection"] == "recency"
    lost = {c: [t for t in this[c] if t not in other[c]] for c in this}
    gained = {c: [t for t in other[c] if t not in this[c]] for c in this}
    assert any(lost.values()), "the tighter budget lost nothing: no test"
    assert marked(sides["this"], "lost") == lost and marked(sides["this"], "gained") == {c: [] for c in this}
    assert marked(sides["other"], "gained") == gained
    assert {c: [i["text"] for i in sides["other"]["categories"][c]] for c in other} == other


def test_compare_needs_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", "--compare", str(tmp_path / "other.db"), "--run", "x"]) == 2
    assert "--compare: only with --db" in capsys.readouterr().err
    (tmp_path / "this.db").touch()
    assert main(["view", "--db", str(tmp_path / "this.db"), "--compare", str(tmp_path / "other.db")]) == 2
    assert "other.db': no such file" in capsys.readouterr().err
