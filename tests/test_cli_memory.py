"""`npcsim memory show` in-process."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import msgspec
import pytest

from sim.cli import main
from sim.cli._terminal import Out
from sim.cli._truncation import print_truncation
from sim.memory import build_working_memory, explain_truncation
from sim.scenario import load_scenario
from tests.helpers import VILLAGE

CATEGORIES = ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs")


def test_memory_show_prints_every_npc_at_two_budgets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "show", VILLAGE]) == 0
    out = capsys.readouterr().out
    for npc in ("blacksmith", "innkeeper", "guard_captain", "snack_machine"):
        assert f"{npc}: default budget" in out and f"{npc}: tight budget" in out
    assert "capitalist snack machine" in out and "[tick 0]" in out
    assert "mandatory" in out and "dropped" in out


def test_memory_show_tells_the_budget_as_split_and_redistributed_and_lists_the_dropped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In a pipe (capsys): the report and the dropped items as tab-separated lines under their header."""
    assert main(["memory", "show", VILLAGE, "--npc", "innkeeper", "--tight", "700"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "category\tsplit\tafter redistribution\tused\tkept\tdropped\treason" in lines
    assert "episodic\t48\t66 (+18)\t66\t1\t2\tbudget" in lines and "limit 700 chars" in out
    assert "dropped (5)" in lines and "category\ttick\treason\ttext" in lines
    assert "episodic\t2\tbudget\tThe guard captain drank alone and said nothing." in lines
    assert "budget: did not fit what was left" in lines
    assert "dropped: nothing" in lines  # the default budget keeps everything of the innkeeper
    assert not any(c in out for c in "│━─"), out  # nothing drawn


def test_the_truncation_on_a_terminal_is_two_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    scenario = load_scenario(VILLAGE)
    state = scenario.initial_state("innkeeper")
    config = msgspec.structs.replace(scenario.memory, max_context_chars=700)
    said = "player: What news of the king?"
    wm = build_working_memory(state, said, config)
    shown = io.StringIO()
    print_truncation(Out(shown, terminal=True), wm.report, explain_truncation(state, said, config, wm))
    out = re.sub(r"\x1b\[[0-9;]*m", "", shown.getvalue())  # rich's own styles
    assert "after redistribution" in out and "reason" in out and "limit 700 chars" in out
    assert re.search(r"episodic\s*│\s*48\s*│\s*66 \(\+18\)\s*│\s*66\s*│\s*1\s*│\s*2\s*│\s*budget", out), out
    assert "dropped (5)" in out and "│ The guard captain drank alone and said nothing." in out
    assert "budget: did not fit what was left" in out


def test_memory_show_json_is_one_object_per_npc_and_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "show", VILLAGE, "--json", "--tight", "700"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["npc"], r["budget"]) for r in rows] == [
        (npc, budget) for npc in ("blacksmith", "innkeeper", "guard_captain", "snack_machine")
        for budget in ("default", "tight")
    ]
    for row in rows:
        assert row["prompt"].endswith(f"{row['npc']}:") and row["report"]["limit_chars"] == row["max_context_chars"]
        for name in CATEGORIES:
            assert sum(d["category"] == name for d in row["dropped"]) == row["report"][name]["dropped"]
    tight = next(r for r in rows if (r["npc"], r["budget"]) == ("innkeeper", "tight"))
    assert tight["dropped"][0] == {"category": "episodic", "tick": 2, "reason": "budget",
                                   "text": "The guard captain drank alone and said nothing."}


PLANTED = "Watched the player hold the east gate against the raiders during the siege."


def test_a_scored_selection_keeps_the_planted_memory_that_recency_drops(capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled `gate` scenario: its [memory] selection is "scored"; `--set memory.selection=recency`
    is the seed's."""
    assert main(["memory", "show", "gate", "--json"]) == 0
    scored = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(["memory", "show", "gate", "--json", "--set", "memory.selection=recency"]) == 0
    recency = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row in scored:
        assert row["report"]["selection"] == "scored" and f"- [tick 1] {PLANTED}\n" in row["prompt"], row["budget"]
    for row in recency:
        assert row["report"]["selection"] == "recency" and PLANTED not in row["prompt"]
        assert {"category": "episodic", "tick": 1, "reason": "cap" if row["budget"] == "default" else "budget",
                "text": PLANTED} in row["dropped"]
    assert main(["memory", "show", "gate"]) == 0
    out = capsys.readouterr().out
    assert "gatekeeper: default budget (2000 chars, scored selection)" in out
    assert "scored selection, limit 2000 chars: prompt" in out


def test_a_stable_prefix_names_what_it_gave_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "show", "gate", "--tight", "700", "--set", "memory.selection=recency",
                 "--set", "memory.stable_prefix=true"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "episodic\t98\t149 (+51)\t149\t3\t18\tstable_prefix" in lines
    assert "episodic\t26\tstable_prefix\tA merchant paid the toll in copper and grumbled." in lines
    assert any(line.endswith("left unused 95 (stable prefix gave up 61)") for line in lines)
    legend = "budget: did not fit what was left; stable_prefix: kept, but the stable prefix starts at a later anchor"
    assert legend in lines


def test_memory_show_unknown_npc_and_broken_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["memory", "show", VILLAGE, "--npc", "dragon"]) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("[scenario]\nname = 'x'\n")
    assert main(["memory", "show", str(bad)]) == 2
    assert "bad.toml" in capsys.readouterr().err


def test_memory_show_recalls_as_a_run_does_from_beyond_the_hot_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An NPC whose scenario gives it more memories than a run holds hot: its oldest, significant
    one is in the prompt only when recall brings it back (what a run's first tick would see)."""
    episodes = ", ".join(
        f'{{ id = "e{i:02}", tick = {i}, text = "The baker sold bread on market day {i}.", significance = 0.2 }}'
        for i in range(1, 45)
    )
    scenario = tmp_path / "old.toml"
    scenario.write_text(
        '[scenario]\nname = "old"\n\n[[locations]]\nid = "mill"\n\n[[npcs]]\nid = "miller"\nname = "Miller"\n'
        'location = "mill"\nsystem_prompt = "You are the miller."\nepisodic = [\n'
        '  { id = "e00", tick = 0, text = "The player buried the silver relic under the old oak.",'
        ' significance = 0.9 },\n'
        f"  {episodes},\n]\n\n[memory]\nselection = \"scored\"\n"
    )
    args = ["memory", "show", str(scenario), "--json", "--input", "p0: Where is the silver relic buried?"]
    assert main(args) == 0
    hot_only = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main([*args, "--set", "memory.scored.recall=8"]) == 0
    recalled = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all("silver relic under" not in r["prompt"] for r in hot_only)
    assert all("- [tick 0] The player buried the silver relic under the old oak.\n" in r["prompt"] for r in recalled)
