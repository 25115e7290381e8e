"""A run's configuration is bounded: shard counts, scenario files, and lists checked in one pass."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import ScenarioError
from sim.protocol.barrier import Barrier, summarise
from sim.scenario import MAX_SCENARIO_BYTES, parse_scenario

ONE_NPC = """
[scenario]
name = "memories"
[[locations]]
id = "square"
[[npcs]]
id = "elder"
name = "Elder"
location = "square"
system_prompt = "You remember everything."
"""


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_a_huge_shard_count_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, ["run", "village", "--shard", "0/100000000"])
    assert "--shard '0/100000000': 100000000 shards; a run has at most 1024" in err
    err = one_line_error(capsys, ["run", "village", "--shard", "0/" + "9" * 4000])
    assert "a run has at most 1024" in err and len(err) < 200


def test_more_shards_than_npcs_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, ["run", "village", "--shard", "0/9", "--broker", "mqtt://127.0.0.1:1"])
    assert "--shard 0/9: 9 shards for 4 NPCs; at most one shard per NPC" in err


def test_the_awaited_shards_are_summarised() -> None:
    barrier = Barrier("0", [str(i) for i in range(1024)], lambda topic: False)
    line = summarise(barrier.awaited(0))
    assert line == "shard 0, shard 1, shard 2, shard 3 and 1020 more"
    assert summarise(["shard 1", "shard 2"]) == "shard 1, shard 2"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_path_that_is_not_a_regular_file_is_one_line_unread(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    path = {"device": Path("/dev/zero"), "fifo": tmp_path / "world.toml", "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)  # opening it would wait for a writer for ever
    err = one_line_error(capsys, ["run", str(path)])
    assert f"{path}: not a regular file; a scenario is a TOML file" in err


@pytest.mark.timeout(20)
def test_a_scenario_file_over_the_bound_is_one_line_unread(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    huge = tmp_path / "huge.toml"
    with huge.open("wb") as f:
        f.truncate(MAX_SCENARIO_BYTES + 1)  # sparse: no disk space, and never read
    err = one_line_error(capsys, ["run", str(huge)])
    assert "1,000,000,001 bytes; a scenario file is at most 1,000,000,000 bytes" in err


def memories(count: int, *, duplicate: bool = False) -> str:
    rows = "".join(f'[[npcs.episodic]]\nid = "m{n}"\ntick = 0\ntext = "memory {n}"\n' for n in range(count))
    return ONE_NPC + rows + ('[[npcs.episodic]]\nid = "m7"\ntick = 1\ntext = "again"\n' if duplicate else "")


@pytest.mark.timeout(60)  # the quadratic check took 4.5 s for 20,000 memories; 200,000 would take minutes
def test_a_200000_memory_scenario_loads_in_one_pass() -> None:
    scenario = parse_scenario(memories(200_000))
    assert len(scenario.npcs[0].episodic) == 200_000
    with pytest.raises(ScenarioError, match=r"npc 'elder' \(npcs\[0\]\), field episodic: duplicate ids \['m7'\]"):
        parse_scenario(memories(200_000, duplicate=True))
