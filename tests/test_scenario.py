"""Scenario files: the village loads; every error names the file, the NPC and the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import ScenarioError
from sim.scenario import load_scenario, parse_scenario
from tests.helpers import VILLAGE

VILLAGE_TOML = Path(VILLAGE).read_text()


def test_village_has_the_world_of_the_article() -> None:
    scenario = load_scenario(VILLAGE)
    assert {n.id for n in scenario.npcs} == {"blacksmith", "innkeeper", "guard_captain", "snack_machine"}
    snack = scenario.initial_state("snack_machine")
    assert "You are a capitalist snack machine trying to make money" in [f.text for f in snack.canonical_facts]
    smith = scenario.initial_state("blacksmith")
    assert any("killed Mayor Aldric three sessions ago" in f.text for f in smith.canonical_facts)
    assert any(w.key == "king" and "dead" in w.value for w in smith.world_state)
    script = [line for p in scenario.players for line in p.script if line.to == "snack_machine"]
    assert any("communis" in line.text.lower() for line in script)
    for npc in scenario.npcs:
        state = scenario.initial_state(npc.id)
        assert state.canonical_facts and state.world_state and state.episodic and state.beliefs and state.dialogue


def test_unknown_key_names_file_npc_and_field() -> None:
    broken = VILLAGE_TOML.replace('id = "innkeeper"', 'id = "innkeeper"\ncolour = "red"', 1)
    line = broken.splitlines().index('colour = "red"') + 1
    with pytest.raises(
        ScenarioError, match=rf"broken.toml:{line}: npc 'innkeeper' \(npcs\[1\]\).*unknown field `colour`"
    ):
        parse_scenario(broken, source="village-broken.toml")


def test_a_near_miss_of_a_field_name_gives_its_line_and_the_field_meant() -> None:
    broken = VILLAGE_TOML.replace("ambient_chance = 0.1\n", "ambient_chanse = 0.1\n", 1)
    line = broken.splitlines().index("ambient_chanse = 0.1") + 1
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(broken, source="v.toml")
    message = str(caught.value)
    assert message.startswith(f"v.toml:{line}: npc 'innkeeper' (npcs[1])"), message
    assert message.endswith("did you mean `ambient_chance`?"), message


def test_schema_errors_give_the_line_of_the_table_or_key() -> None:
    cases = [
        (VILLAGE_TOML.replace("seed = 7", 'seed = "x"', 1), 'seed = "x"', "Expected `int`, got `str`"),
        ("scenaro = 1\n" + VILLAGE_TOML, "scenaro = 1", "did you mean `scenario`?"),
        (VILLAGE_TOML + "\n[memory]\nmax_belief = 2\n", "max_belief = 2", "did you mean `max_beliefs`?"),
    ]
    for text, wanted, needle in cases:
        line = next(i for i, text_line in enumerate(text.splitlines(), 1) if text_line.startswith(wanted))
        with pytest.raises(ScenarioError, match=rf"^v\.toml:{line}: .*{re.escape(needle)}"):
            parse_scenario(text, source="v.toml")


def test_a_bad_share_sum_is_rounded() -> None:
    shares = "\n[memory]\ndialogue_share = 0.7\nepisodic_share = 0.45\nbelief_share = 0.15\n"
    with pytest.raises(ScenarioError, match=r"must be <= 1, got 1\.3 \(dialogue_share=0\.7"):
        parse_scenario(VILLAGE_TOML + shares, source="v.toml")


def test_wrong_type_names_the_field() -> None:
    broken = VILLAGE_TOML.replace('{ id = "e1", tick = 0, text = "Hid', '{ id = "e1", tick = "dawn", text = "Hid', 1)
    with pytest.raises(ScenarioError, match=r"npc 'innkeeper'.*field episodic\[0\]\.tick.*Expected `int`, got `str`"):
        parse_scenario(broken, source="v.toml")


def test_out_of_range_value_is_refused() -> None:
    broken = VILLAGE_TOML.replace("significance = 0.9 },", "significance = 1.5 },", 1)
    with pytest.raises(ScenarioError, match=r"npc 'blacksmith'.*significance.*<= 1.0"):
        parse_scenario(broken, source="v.toml")


def test_unknown_location_and_unknown_target() -> None:
    with pytest.raises(ScenarioError, match=r"npc 'blacksmith' \(npcs\[0\]\), field location: unknown location 'moon'"):
        parse_scenario(VILLAGE_TOML.replace('location = "forge"', 'location = "moon"', 1), source="v.toml")
    with pytest.raises(ScenarioError, match=r"player 'player'.*script\[0\]\.to: unknown NPC 'vending'"):
        unknown = VILLAGE_TOML.replace('to = "snack_machine", text = "Comrade', 'to = "vending", text = "Comrade', 1)
        parse_scenario(unknown, source="v.toml")


def test_syntax_error_and_missing_file() -> None:
    with pytest.raises(ScenarioError, match=r"v.toml: not valid TOML"):
        parse_scenario("[scenario\nname=1", source="v.toml")
    with pytest.raises(ScenarioError, match=r"nowhere.toml: cannot read"):
        load_scenario("nowhere.toml")


def test_bad_memory_config_in_scenario_names_the_field() -> None:
    with pytest.raises(ScenarioError, match=r"max_beliefs must be a whole number >= 0, got -2.*memory"):
        parse_scenario(VILLAGE_TOML + "\n[memory]\nmax_beliefs = -2\n", source="v.toml")


def test_a_stable_prefix_is_read_from_the_memory_table_and_a_bad_one_refused_in_one_line() -> None:
    memory = parse_scenario(VILLAGE_TOML + "\n[memory]\nstable_prefix = true\n", source="v.toml").memory
    assert memory.stable_prefix is True
    assert parse_scenario(VILLAGE_TOML, source="v.toml").memory.stable_prefix is False
    refused = r"^v\.toml:\d+: Expected `bool`, got `str` - at `\$\.memory\.stable_prefix`$"
    with pytest.raises(ScenarioError, match=refused):
        parse_scenario(VILLAGE_TOML + '\n[memory]\nstable_prefix = "yes"\n', source="v.toml")


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ('selection = "bm25"', r"Invalid enum value 'bm25' - at `\$\.memory\.selection`"),
        ("recency_weight = -1", r"recency_weight must be a number >= 0, got -1\.0"),
        ("relevance_weight = -0.5", r"relevance_weight must be a number >= 0, got -0\.5"),
        ("importance_weight = nan", r"importance_weight must be a number >= 0, got nan"),
        ("half_life_ticks = 0", r"half_life_ticks must be a number > 0, got 0\.0"),
        ("half_life_ticks = inf", r"half_life_ticks must be a number > 0, got inf"),
        ("dialogue_importance = 1.5", r"dialogue_importance must be a number from 0 to 1, got 1\.5"),
    ],
)
def test_bad_selection_settings_are_one_line_errors(setting: str, needle: str) -> None:
    with pytest.raises(ScenarioError, match=rf"^v\.toml:\d+: {needle}") as refused:
        table = "[memory]" if setting.startswith("selection") else '[memory]\nselection = "scored"\n[memory.scored]'
        parse_scenario(f"{VILLAGE_TOML}\n{table}\n{setting}\n", source="v.toml")
    assert "\n" not in str(refused.value)


def test_a_scored_selection_is_read_from_the_memory_table() -> None:
    settings = ('selection = "scored"\n[memory.scored]\nhalf_life_ticks = 5\nrecency_weight = 0.5\n'
                "importance_weight = 2\nrelevance_weight = 1.5\ndialogue_importance = 0.25\n")
    memory = parse_scenario(VILLAGE_TOML + "\n[memory]\n" + settings, source="v.toml").memory
    scored = memory.scored
    assert (memory.selection, scored.half_life_ticks, scored.recency_weight, scored.importance_weight,
            scored.relevance_weight, scored.dialogue_importance) == ("scored", 5.0, 0.5, 2.0, 1.5, 0.25)
    assert parse_scenario(VILLAGE_TOML, source="v.toml").memory.selection == "recency"


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ('key = "king"', 'key = "<b>k</b>"', r"world\[0\], key '<b>k</b>': the world-state topic carries only keys"),
        ('key = "king"', 'key = "a/b"', r"world\[0\], key 'a/b'"),
        ('key = "king"', f'key = "{"k" * 65}"', r"world\[0\], key 'k+': key of 65 characters \(bound 64\)"),
        ('value = "late autumn"', f'value = "{"x" * 257}"', r"world\[1\], key 'season': value of 'season' has 257"),
        ("[[world]]", "".join(f'[[world]]\nkey = "k{i}"\nvalue = "v"\n' for i in range(62)) + "[[world]]",
         r"world: 65 keys, over the 64"),
    ],
)
def test_the_shared_world_is_what_the_world_state_topic_accepts(old: str, new: str, needle: str) -> None:
    """A run publishes [[world]] at its start: the loader refuses what that topic would drop, in one line."""
    with pytest.raises(ScenarioError, match=needle) as refused:
        parse_scenario(VILLAGE_TOML.replace(old, new, 1), source="v.toml")
    assert "\n" not in str(refused.value) and str(refused.value).startswith("v.toml: world")


def test_the_run_refuses_such_a_world_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tagged.toml"
    path.write_text(VILLAGE_TOML.replace('key = "king"', 'key = "<b>k</b>"', 1))
    assert main(["run", str(path), "--ticks", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'<b>k</b>'" in err and "Traceback" not in err
