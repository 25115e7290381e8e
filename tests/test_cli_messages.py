"""The small messages of the first hour: each says what is wrong and what to do, naming the
option the user gave. (The scenario's line numbers and the share sum: test_scenario; the
favicon: test_view_server; `view --run nosuch-run`: test_attach.)"""

from __future__ import annotations

import argparse
import logging
import socket
from pathlib import Path

import pytest

from sim.cli import build_parser, main
from tests.helpers import VILLAGE, MosquittoProcess


def _help_of(*command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in command:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def test_a_view_port_in_use_blames_view(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["run", VILLAGE, "--ticks", "1", "--view", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"npcsim: error: --view {port}: cannot listen on 127.0.0.1:{port}") and "--port" not in err


def test_scenario_generate_help_describes_every_option() -> None:
    parser = _help_of("scenario", "generate")
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in options} == {"npcs", "locations", "seed", "out", "day"}
    assert all(a.help and len(a.help) > 10 for a in options), [(a.dest, a.help) for a in options]
    assert parser.description and "locations" in parser.description


def test_memory_show_of_an_unknown_npc_names_the_valid_ids(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "show", VILLAGE, "--npc", "nobody"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"npcsim: error: --npc: no NPC nobody in {VILLAGE}; "
                   "its NPCs: blacksmith, guard_captain, innkeeper, snack_machine")


def test_audit_export_help_does_not_call_rotate_read_only() -> None:
    text = _help_of("audit", "export").format_help()
    assert "opened read-only" not in text and "read-only, unless --rotate" in text


def test_the_load_test_table_says_one_sweep_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--agents", "50", "--requests", "50", "--concurrency", "0", "--processes", "1"]) == 0
    out = capsys.readouterr().out
    assert "(1 sweep process)" in out and "1 sweep processes" not in out


@pytest.mark.mosquitto
def test_remote_workers_without_a_worker_say_to_start_one(
    mosquitto: MosquittoProcess, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with caplog.at_level(logging.WARNING, logger="sim.inference"):
        assert main(["run", VILLAGE, "--broker", mosquitto.url, "--run-id", "lonely", "--ticks", "3",
                     "--remote-workers", "--set", "inference.inference_timeout=0.5", "--quiet"]) == 0
    (said,) = [r.getMessage() for r in caplog.records if "no reply to request" in r.getMessage()]
    assert f"Start one with `npcsim worker --broker {mosquitto.url} --run lonely`" in said, said
