"""Settings declared once: `--set KEY=VALUE` converts into the config Structs (sim.settings),
a bad key or value is one line naming it, and the command line stays small."""

from __future__ import annotations

import argparse
import json

import pytest

from sim.cli import build_parser
from sim.errors import ConfigError
from sim.memory import ScoredSelection, WorkingMemoryConfig
from sim.settings import check_settings, parse_settings, with_settings
from sim.shard import InferenceConfig, RunConfig
from tests.helpers import VILLAGE, npcsim_in_process

MAX_OPTIONS = 130


def _options(parser: argparse.ArgumentParser) -> list[str]:
    """Every option a user types, per command: each `--name` of `parser` and its sub-commands
    (aliases of one action each counted: they choose different things), help, the top-level
    `--version`/`-v`, a boolean's `--no-` form and positionals aside."""
    found: list[str] = []
    for action in parser._actions:  # argparse has no public listing of a parser's actions
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _options(sub)
            continue
        found += [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
    return found


def test_the_command_line_has_at_most_130_options() -> None:
    """Counted as issue 43 counted them (165 before it, at most 130 after): the options a user
    types over every command. Per-setting flags only where people type them daily; the rest is
    `--set KEY=VALUE`."""
    top = {"--verbose"}
    options = [o for o in _options(build_parser()) if o not in top]
    assert len(options) <= MAX_OPTIONS, f"{len(options)} options: {options}"


def test_a_setting_is_converted_by_its_type() -> None:
    config = with_settings(WorkingMemoryConfig(), {"selection": "scored", "scored.half_life_ticks": "3",
                                                   "max_context_tokens": "none", "redistribute_unused": "false",
                                                   "dialogue_share": "0.5"})
    assert config.selection == "scored" and config.scored == ScoredSelection(half_life_ticks=3.0)
    assert config.max_context_tokens is None and config.redistribute_unused is False and config.dialogue_share == 0.5
    inference = with_settings(InferenceConfig(), {"backend_options.stop": '["\\n", "."]', "concurrency": "8"})
    assert inference.backend_options == {"stop": ["\n", "."]} and inference.concurrency == 8


@pytest.mark.parametrize(("settings", "message"), [
    ({"no.such.key": "1"}, r"^--set memory\.no\.such\.key: no setting 'no'; known: max_context_chars, "),
    ({"max_context_chars": "-3"},
     r"^--set memory\.max_context_chars=-3: max_context_chars must be a whole number >= 0, got -3$"),
    ({"max_context_chars": "lots"}, r"^--set memory\.max_context_chars=lots: Expected `int`, got `str`$"),
    ({"scored.relevance_weight": "-1"},
     r"^--set memory\.scored\.relevance_weight=-1: relevance_weight must be a number >= 0, got -1\.0$"),
    ({"selection.x": "1"}, r"^--set memory\.selection\.x: selection is one value, with no settings inside it$"),
    ({"dialogue_share": "0.9"}, r"^--set memory\.dialogue_share=0\.9: dialogue_share \+ episodic_share"),
    ({"selection": "best"}, r"^--set memory\.selection=best: Invalid enum value 'best' \(one of: recency, scored\)$"),
    ({"on_overflow": "drop"}, r"^--set memory\.on_overflow=drop: Invalid enum value 'drop' \(one of: keep, raise\)$"),
    ({"scored.recall": "-1"}, r"^--set memory\.scored\.recall=-1: recall must be a whole number >= 0, got -1$"),
    ({"scored.recall": "65"}, r"^--set memory\.scored\.recall=65: recall must be at most 64 \(memories retrieved"),
    ({"scored.recall": "many"}, r"^--set memory\.scored\.recall=many: Expected `int`, got `str`$"),
    ({"scored.recall": "2.5"}, r"^--set memory\.scored\.recall=2\.5: Expected `int`, got `str`$"),
])
def test_a_bad_setting_is_one_line_naming_it(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        with_settings(WorkingMemoryConfig(), settings, "memory.")
    assert "\n" not in str(refused.value)


def test_malformed_or_repeated_settings_are_refused() -> None:
    assert parse_settings(["memory.selection=scored", "bots = 3"]) == {"memory.selection": "scored", "bots": "3"}
    for texts, message in ((["memory.selection"], "expected KEY=VALUE"), (["=1"], "expected KEY=VALUE"),
                           (["memory..selection=1"], "expected KEY=VALUE"),
                           (["bots=1", "bots=2"], "--set bots: given twice")):
        with pytest.raises(ConfigError, match=message):
            parse_settings(texts)


def test_a_run_checks_its_memory_settings_when_it_is_made() -> None:
    assert check_settings(WorkingMemoryConfig, {"max_context_chars": "700"}) == {"max_context_chars": 700}
    with pytest.raises(ConfigError, match=r"^--set memory\.selecton: no setting 'selecton'"):
        RunConfig(scenario=VILLAGE, memory={"selecton": "scored"})


def test_a_run_with_a_scored_selection_set_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    ran = npcsim_in_process(capsys, "run", VILLAGE, "--set", "memory.selection=scored", "--ticks", "5", "--quiet")
    assert ran.code == 0, ran.err


@pytest.mark.parametrize(("setting", "message"), [
    ("no.such.key=1", "npcsim: error: --set no.such.key: no setting 'no'; known: scenario, "),
    ("memory.max_context_chars=-3",
     "npcsim: error: --set memory.max_context_chars=-3: max_context_chars must be a whole number >= 0, got -3"),
    ("inference.concurrency=0",
     "npcsim: error: --set inference.concurrency=0: inference.concurrency must be a whole number >= 1, got 0"),
])
def test_a_bad_run_setting_is_one_line_and_exit_2(
    setting: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = npcsim_in_process(capsys, "run", VILLAGE, "--set", setting, "--ticks", "5", "--quiet")
    assert ran.code == 2
    assert len(ran.err.strip().splitlines()) == 1 and ran.err.startswith(message), ran.err


def test_memory_show_takes_memory_settings_only(capsys: pytest.CaptureFixture[str]) -> None:
    ran = npcsim_in_process(capsys, "memory", "show", "gate", "--json", "--set", "memory.selection=recency",
                            "--set", "memory.max_context_tokens=300")
    assert ran.code == 0, ran.err
    rows = [json.loads(line) for line in ran.out.splitlines()]
    assert rows and all(r["report"]["selection"] == "recency" and r["max_context_tokens"] == 300 for r in rows)
    ran = npcsim_in_process(capsys, "memory", "show", "gate", "--set", "inference.concurrency=3")
    assert ran.code == 2
    assert ran.err.strip() == ("npcsim: error: --set inference.concurrency: not a setting of npcsim memory show, "
                               "which takes memory.*")
