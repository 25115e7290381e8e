"""`npcsim loadtest`: seeded agents, the checker catching a broken builder, figures, options."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import psutil
import pytest

import sim.loadtest
from sim.checkers import check_working_memory
from sim.cli import build_parser, main
from sim.cli.loadtest import loadtest_command
from sim.errors import NpcsimError
from sim.loadtest import LoadTestConfig, generate_state, profile_of, run_loadtest
from sim.memory import WorkingMemoryConfig, build_working_memory
from tests.broken_builders import drop_first_fact, ignore_budget, refuse_to_build, say_twice
from tests.helpers import NPCSIM, env_for, eventually_sync, npcsim_in_process

RESULT_KEYS = {
    "agents", "seed", "duration_s", "processes", "concurrency", "backend", "latency_ms", "broker",
    "max_context_chars", "max_context_tokens", "snapshots", "sweep_snapshots", "snapshots_per_s",
    "all_snapshots_per_s", "inferences", "inferences_per_s", "build_latency", "check_latency", "infer_latency",
    "round_trip_latency", "violations", "first_violations", "over_budget", "fallbacks", "peak_rss_mb", "timeline",
    "truncation", "budgets", "sweep", "output", "gates", "server_limits",
}
LATENCY_KEYS = {"count", "p50_ms", "p95_ms", "p99_ms", "max_ms"}


def test_same_seed_same_states() -> None:
    encode = msgspec.msgpack.encode
    for index in range(0, 400, 7):
        assert encode(generate_state(3, index, 2000)) == encode(generate_state(3, index, 2000))
    assert any(encode(generate_state(3, i, 2000)) != encode(generate_state(4, i, 2000)) for i in range(20))


def test_states_cover_the_hard_shapes() -> None:
    profiles = [profile_of(0, i) for i in range(2000)]
    assert set(profiles) == set(sim.loadtest.PROFILES)
    assert 0.03 < profiles.count("pathological") / len(profiles) < 0.07
    states = [generate_state(0, i, 2000) for i in range(300)]
    text = "".join(f.text for s in states for f in s.canonical_facts)
    assert any(ord(c) > 0x2FFF for c in text)  # CJK or emoji
    assert "\u0301" in text  # combining marks
    assert any(not s.dialogue and not s.episodic for s in states)
    huge = next(i for i in range(2000) if profile_of(0, i) == "huge")
    assert len(generate_state(0, huge, 2000).dialogue) >= 300


def test_pathological_agents_are_over_budget_not_violations() -> None:
    config = WorkingMemoryConfig()
    pathological = [i for i in range(600) if profile_of(1, i) == "pathological"]
    assert pathological
    for index in pathological:
        state = generate_state(1, index, config.max_context_chars)
        wm = build_working_memory(state, "Hello there.", config)
        assert wm.report.over_budget
        assert check_working_memory(state, "Hello there.", config, wm) == []


async def test_small_sweep_has_no_violations_and_sane_figures() -> None:
    result = await run_loadtest(LoadTestConfig(agents=300, requests=3000, duration_s=None, concurrency=0, processes=2))
    assert result.violations == 0 and result.first_violations == []
    assert result.snapshots == result.sweep_snapshots == 3000
    assert 0 < result.over_budget < 3000  # the pathological share, counted apart
    assert result.snapshots_per_s > 0
    assert result.build_latency.count == result.check_latency.count == 3000
    assert 0 < result.build_latency.p50_ms <= result.build_latency.p95_ms <= result.build_latency.p99_ms
    assert result.build_latency.p99_ms <= result.build_latency.max_ms
    assert result.peak_rss_mb > 0


@pytest.mark.parametrize(("builder", "invariant"), [(drop_first_fact, "I1"), (ignore_budget, "I2"), (say_twice, "I8")])
def test_broken_builder_is_caught_and_exits_1(
    builder: object, invariant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(
        ["loadtest", "--agents", "200", "--requests", "400", "--concurrency", "0", "--processes", "1"]
    )
    args.builder = builder
    assert loadtest_command(args) == 1
    out = capsys.readouterr().out
    assert invariant in out
    assert "agent-" in out
    assert "violation" in out


async def test_broken_builder_result_names_agent_and_invariant() -> None:
    result = await run_loadtest(
        LoadTestConfig(agents=100, requests=300, duration_s=None, concurrency=0, processes=1), builder=drop_first_fact
    )
    assert result.violations > 0
    assert 0 < len(result.first_violations) <= 10
    first = result.first_violations[0]
    assert first.invariant == "I1" and first.agent_id.startswith("agent-") and first.source == "sweep"


async def test_a_failing_sweep_process_is_named_with_its_error() -> None:
    config = LoadTestConfig(agents=10, requests=10, duration_s=None, concurrency=0, processes=1)
    with pytest.raises(NpcsimError, match=r"sweep process 0 failed: RuntimeError: no working memory for agent-"):
        await run_loadtest(config, builder=refuse_to_build)


def test_json_has_the_documented_keys(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    code = main(["loadtest", "--agents", "100", "--requests", "500", "--concurrency", "0", "--processes", "1",
                 "--json", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())
    assert set(figures) == RESULT_KEYS
    for name in ("build_latency", "check_latency", "infer_latency", "round_trip_latency"):
        assert set(figures[name]) == LATENCY_KEYS
    assert figures["violations"] == 0 and figures["snapshots"] == 500


def test_a_scored_selection_is_checked_on_every_snapshot_and_named(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    code = main(["loadtest", "--agents", "100", "--requests", "500", "--concurrency", "0", "--processes", "1",
                 "--set", "memory.selection=scored", "--json", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())
    assert figures["violations"] == 0 and figures["snapshots"] == 500
    assert figures["truncation"]["selections"] == {"recency": 0, "scored": 500}


@pytest.mark.parametrize("selection", ["recency", "scored"])
def test_a_stable_prefix_is_checked_on_every_snapshot(tmp_path: Path, selection: str) -> None:
    out = tmp_path / "out.json"
    code = main(["loadtest", "--agents", "100", "--requests", "500", "--concurrency", "0", "--processes", "1",
                 "--set", f"memory.selection={selection}", "--set", "memory.stable_prefix=true", "--json", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())
    assert figures["violations"] == 0 and figures["snapshots"] == 500


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--set", "memory.selection=bm25"], "--set memory.selection=bm25"),
        (["--agents", "0"], "--agents"),
        (["--agents", "many"], "--agents"),
        (["--duration", "0"], "--duration"),
        (["--duration", "nan"], "--duration"),
        (["--requests", "-3"], "--requests"),
        (["--concurrency", "-1"], "--concurrency"),
        (["--processes", "x"], "--processes"),
        (["--max-context-chars", "0"], "--max-context-chars"),
        (["--max-context-tokens", "0"], "--max-context-tokens"),
        (["--latency-ms", "-5"], "--latency-ms"),
        (["--broker", "localhost:1883"], "--broker"),
        (["--backend", "nope"], "--backend"),
        (["--seed", "-1"], "--seed"),
        (["--json", "/no/such/dir/out.json"], "--json"),
        (["--plot", "/no/such/dir/out.png"], "--plot"),
        (["--duration", "5", "--requests", "5"], "--requests"),
    ],
)
def test_bad_option_is_named(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    ran = npcsim_in_process(capsys, "loadtest", *argv)
    assert ran.code == 2
    assert named in ran.err


def test_nothing_to_run_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--concurrency", "0", "--processes", "0"]) == 2
    assert "--concurrency 0 with --processes 0" in capsys.readouterr().err


def test_plot_without_matplotlib_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if the extra were missing
    code = main(["loadtest", "--requests", "5", "--processes", "0", "--plot", str(tmp_path / "x.png")])
    assert code == 2
    assert "npcsim[plot]" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_plot_writes_a_png_of_real_curves(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out, figures = tmp_path / "load.png", tmp_path / "load.json"
    code = main(["loadtest", "--agents", "100", "--duration", "3", "--processes", "0", "--concurrency", "4",
                 "--plot", str(out), "--json", str(figures)])
    assert code == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    timeline = json.loads(figures.read_text())["timeline"]
    # What the plot's curves are drawn from: points that move.
    assert len([p for p in timeline if p["snapshots_per_s"] > 0 and p["inferences_per_s"] > 0]) >= 2


def test_in_a_pipe_the_result_is_plain_lines(tmp_path: Path) -> None:
    """Through a pipe: no box drawing, no escape sequence, a header line and tab-separated rows."""
    done = subprocess.run([NPCSIM, "loadtest", "--agents", "100", "--requests", "100", "--processes", "1",
                           "--concurrency", "2,4"], capture_output=True, text=True, env=env_for(tmp_path),
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert not any(char in done.stdout for char in "━│┃╇\x1b")
    assert lines[0] == "figure\tvalue" and "invariant violations\t0" in lines
    assert "latency (ms)\tp50\tp95\tp99\tmax\tsamples" in lines
    assert "category\tbudget\tcut\tkept\tdropped\tduplicate\tused" in lines
    assert any(line.startswith("2,000 ch\t4\t") for line in lines)  # the sweep's rows
    assert all("\t" in line for line in lines[:-1]) and "knee" in lines[-1]


def test_ctrl_c_ends_a_loadtest_with_one_line_and_exit_130(tmp_path: Path) -> None:
    """SIGINT to the process group, as a terminal's Ctrl-C, once the sweep process is up:
    one line, exit code 130, no traceback, no child left."""
    with subprocess.Popen([NPCSIM, "loadtest", "--agents", "200", "--duration", "60", "--processes", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for(tmp_path),
                          start_new_session=True) as proc:
        try:
            children = eventually_sync(lambda: _sweep_processes(proc.pid), what="the sweep process running")
            os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert (proc.returncode, out, err) == (130, "", "npcsim: interrupted\n")
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == []


def _sweep_processes(pid: int) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            if "sim.loadtest._sweep_worker" in child.cmdline():
                found.append(child)
    return found
