"""A large scenario is parsed a part of its NPCs at a time (sim.scenario_text), to the same scenario.

The parts path is taken for texts over `PARTS_FROM`; here it is lowered to nothing, and the
parts to a few NPCs, so that small texts go through it: generated worlds with and without a
day, the bundled scenarios (tables after the NPCs', sub-tables of NPCs), and hypothesis'
worlds give the scenario the whole parse gives. A text with a multi-line string, or a
problem in one part, is parsed whole, and the error is the one the whole parse gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.scenario
import sim.scenario_text
from sim.errors import ScenarioError
from sim.generate import generate_scenario
from sim.resources import bundled_scenario, scenario_names
from sim.scenario import parse_scenario
from sim.scenario_text import cut

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def in_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim.scenario, "PARTS_FROM", 0)
    monkeypatch.setattr(sim.scenario_text, "NPCS_PER_PART", 3)


def whole(text: str) -> object:
    sim.scenario.PARTS_FROM, before = 1 << 40, sim.scenario.PARTS_FROM
    try:
        return parse_scenario(text, source="w.toml")
    finally:
        sim.scenario.PARTS_FROM = before


@pytest.mark.parametrize("name", scenario_names())
def test_the_bundled_scenarios_parse_the_same_in_parts(in_parts: None, name: str) -> None:
    text = bundled_scenario(name)
    assert parse_scenario(text, source="w.toml") == whole(text)


@settings(max_examples=25, deadline=None)
@given(npcs=st.integers(1, 40), locations=st.integers(1, 7), seed=st.integers(0, 5), day=st.booleans())
def test_generated_worlds_parse_the_same_in_parts(npcs: int, locations: int, seed: int, day: bool) -> None:
    text = generate_scenario(npcs=npcs, locations=locations, seed=seed, day=day)
    parts = cut(text, per_part=3)
    assert parts is not None and sum(1 for _ in parts.npc_parts()) == -(-npcs // 3)
    sim.scenario.PARTS_FROM, before = 0, sim.scenario.PARTS_FROM
    try:
        assert parse_scenario(text, source="w.toml") == whole(text)
    finally:
        sim.scenario.PARTS_FROM = before


def test_a_text_that_cannot_be_cut_safely_is_parsed_whole(in_parts: None) -> None:
    lines = generate_scenario(npcs=5, locations=2).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith('system_prompt = "You are N1,'))
    lines[at] = 'system_prompt = """\n[[npcs]]\nYou are N1."""'  # a header-like line inside a string
    tricky = "\n".join(lines) + "\n"
    assert cut(tricky) is None
    assert parse_scenario(tricky, source="w.toml") == whole(tricky)


def test_an_error_in_a_part_is_the_whole_parse_s_error(in_parts: None, tmp_path: Path) -> None:
    text = generate_scenario(npcs=12, locations=3).replace('id = "n10"\n', 'id = "n10"\nmood = "sad"\n')
    with pytest.raises(ScenarioError) as parts:
        parse_scenario(text, source="w.toml")
    with pytest.raises(ScenarioError) as at_once:
        whole(text)
    assert str(parts.value) == str(at_once.value)
    assert "npc 'n10' (npcs[10]), field mood" in str(parts.value) or "mood" in str(parts.value)
