"""Package data (sim.resources) and the commands over it: scenario list/show, a bundled
scenario by name, --version, --help."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import msgspec
import pytest

from sim.broker import BROKER_CONFIG
from sim.cli import main
from sim.errors import ScenarioError
from sim.memory import WorkingMemoryConfig
from sim.resources import broker_config_dir, bundled_scenario, scenario_names
from sim.scenario import load_scenario
from tests.helpers import REPO, VILLAGE


def test_package_data_is_the_top_level_files() -> None:
    """One source of truth: the package's data dirs link to the operator-facing ones."""
    for name in ("broker-config", "scenarios"):
        link = REPO / "sim" / "data" / name
        assert link.is_symlink() and link.resolve() == (REPO / name).resolve()
    assert scenario_names() == sorted(p.stem for p in (REPO / "scenarios").glob("*.toml"))
    assert bundled_scenario("village") == Path(VILLAGE).read_text(encoding="utf-8")
    assert broker_config_dir().joinpath("dev.conf").read_text() == (REPO / "broker-config" / "dev.conf").read_text()
    assert (BROKER_CONFIG / "auth.conf").read_text() == (REPO / "broker-config" / "auth.conf").read_text()


@pytest.mark.parametrize(
    "name", ["", "nope", "village.toml", "VILLAGE", "../scenarios/village", "scenarios/village", "/etc/passwd", "."]
)
def test_only_a_bundled_name_is_a_bundled_scenario(name: str) -> None:
    with pytest.raises(ScenarioError, match="bundled: gate, town-day, village"):
        bundled_scenario(name)


def test_a_bundled_scenario_loads_by_name_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_scenario("village") == load_scenario(VILLAGE)
    (tmp_path / "village").mkdir()  # a folder of that name is not a scenario file: the bundled one still loads
    assert load_scenario("village").scenario.name == "village"


def test_a_file_wins_over_a_bundled_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    mine = bundled_scenario("village").replace('name = "village"', 'name = "mine"', 1)
    Path("village").write_text(mine)
    assert load_scenario("village").scenario.name == "mine"


def test_an_unknown_scenario_names_the_bundled_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError, match=r"^villag: cannot read the scenario file: .*bundled scenarios.*village"):
        load_scenario("villag")


def test_the_commented_memory_defaults_are_the_real_ones() -> None:
    """The village's commented-out [memory] block documents the defaults: uncommented, it
    must parse to exactly WorkingMemoryConfig() (but for the example token limit)."""
    text = Path(VILLAGE).read_text()
    block = text[text.index("# [memory]"):]
    lines = [line.removeprefix("# ") for line in block.splitlines() if "max_context_tokens" not in line]
    raw = tomllib.loads("\n".join(lines))
    assert msgspec.convert(raw["memory"], WorkingMemoryConfig) == WorkingMemoryConfig()  # as a scenario reads it
    assert set(raw["memory"]) | {"max_context_tokens"} == set(WorkingMemoryConfig.__struct_fields__)


def test_scenario_show_writes_the_file_out_runnable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["scenario", "show", "village"]) == 0
    out = capsys.readouterr().out
    assert out == Path(VILLAGE).read_text(encoding="utf-8")
    (tmp_path / "my.toml").write_text(out)
    assert load_scenario(tmp_path / "my.toml") == load_scenario(VILLAGE)


@pytest.mark.parametrize("name", ["nope", "../broker-config/dev", ""])
def test_scenario_show_of_an_unknown_name_is_one_line(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scenario", "show", name]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"npcsim: error: no bundled scenario named {name!r}; bundled: gate, town-day, village\n"


def test_scenario_list_names_each_bundled_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scenario", "list"]) == 0
    out = capsys.readouterr().out
    for name in scenario_names():
        assert re.search(rf"^\s*{re.escape(name)}\s", out, re.MULTILINE), out


def test_memory_show_and_run_take_a_bundled_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "show", "village", "--npc", "snack_machine"]) == 0
    assert "snack_machine" in capsys.readouterr().out
    assert main(["run", "no-such-world", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-world" in err and "village" in err, err


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"npcsim {version('npcsim')}\n"


def test_help_lists_every_command_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    listed = out[out.index("commands"):].splitlines()[1:]
    commands = {}
    for line in listed:
        match = re.fullmatch(r"  (\S+(?: \S+)?)\s{2,}(\S.*)", line)
        assert match, f"not one command with its help on one line: {line!r}"
        commands[match[1]] = match[2]
    expected = {"run", "subscribe", "worker", "loadtest", "memory show", "scenario generate", "scenario list",
                "scenario show", "audit list", "audit show", "audit replay"}
    assert expected <= set(commands), sorted(commands)
    for command in commands:  # each is a real command with its own help
        with pytest.raises(SystemExit) as exit_:
            main([*command.split(), "--help"])
        assert exit_.value.code == 0
    capsys.readouterr()
