"""`npcsim memory show` in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.cli import main
from tests.helpers import VILLAGE


def test_memory_show_prints_every_npc_at_two_budgets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "show", VILLAGE]) == 0
    out = capsys.readouterr().out
    for npc in ("blacksmith", "innkeeper", "guard_captain", "snack_machine"):
        assert f"{npc}: default budget" in out and f"{npc}: tight budget" in out
    assert "capitalist snack machine" in out and "[tick 0]" in out
    assert "mandatory" in out and "dropped" in out


def test_memory_show_unknown_npc_and_broken_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["memory", "show", VILLAGE, "--npc", "dragon"]) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("[scenario]\nname = 'x'\n")
    assert main(["memory", "show", str(bad)]) == 2
    assert "bad.toml" in capsys.readouterr().err
