"""The exact rendering of one village NPC, pinned. A change here changes what models see."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.memory import WorkingMemoryConfig, build_working_memory
from sim.scenario import load_scenario
from tests.helpers import VILLAGE

GOLDEN = Path(__file__).parent / "golden"
SAID = "player: Comrade machine, the snacks belong to the people."


@pytest.mark.parametrize(("name", "config"), [("default", WorkingMemoryConfig()),
                                              ("tight", WorkingMemoryConfig(max_context_chars=700))])
def test_snack_machine_rendering_is_pinned(name: str, config: WorkingMemoryConfig) -> None:
    state = load_scenario(VILLAGE).initial_state("snack_machine")
    prompt = build_working_memory(state, SAID, config).prompt
    assert prompt == (GOLDEN / f"snack_machine_{name}.txt").read_text(encoding="utf-8")
    assert "You are a capitalist snack machine trying to make money" in prompt
