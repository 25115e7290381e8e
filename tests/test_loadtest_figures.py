"""`npcsim loadtest` figures that move and figures a user tunes with: timeline, truncation, budgets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import ConfigError
from sim.loadtest import (
    CATEGORIES,
    LoadTestConfig,
    Progress,
    TruncationTally,
    generate_state,
    knee_concurrency,
    progress_view,
    run_loadtest,
)
from sim.memory import WorkingMemoryConfig, build_working_memory
from tests.helpers import npcsim_in_process

TRUNCATION_KEYS = {"cut_fraction", "kept_mean", "dropped_mean", "used_fraction_mean", "duplicate_mean"}
DURATION_S = 5


@pytest.mark.parametrize(
    ("mode", "concurrency", "processes"),
    [("sweep only", 0, 1), ("round trip only", 8, 0), ("both", 8, 1)],
)
async def test_the_monitor_runs_about_once_a_second_in_every_mode(mode: str, concurrency: int, processes: int) -> None:
    """The scripted backend answers without suspending: the round trip must still let the monitor run."""
    seen: list[float] = []
    result = await run_loadtest(
        LoadTestConfig(agents=300, duration_s=DURATION_S, concurrency=concurrency, processes=processes),
        on_progress=lambda p: seen.append(p.elapsed_s),
    )
    moving = [p for p in result.timeline if p.snapshots_per_s > 0]
    assert len(moving) >= DURATION_S - 1, (mode, result.timeline)
    if concurrency:
        inferring = [p for p in result.timeline if p.inferences_per_s > 0 and p.round_trip_p50_ms > 0]
        assert len(inferring) >= DURATION_S - 1, (mode, result.timeline)
    assert all(p.rss_mb > 0 for p in result.timeline)
    assert [p.t_s for p in result.timeline] == sorted(p.t_s for p in result.timeline)
    assert len(seen) >= DURATION_S - 1  # the live display was updated as often


def test_tally_matches_the_reports_it_was_given() -> None:
    config = WorkingMemoryConfig(max_context_chars=800)
    reports = [build_working_memory(generate_state(5, i, 800), "Hello there.", config).report for i in range(60)]
    tally = TruncationTally()
    for report in reports[:25]:
        tally.record(report)
    rest = TruncationTally()
    for report in reports[25:]:
        rest.record(report)
    tally.merge(TruncationTally.from_wire(rest.to_wire()))  # as a sweep process's delta arrives
    figures = tally.figures()
    n = len(reports)
    assert figures.snapshots == n
    assert figures.over_budget_fraction == round(sum(r.over_budget for r in reports) / n, 4)
    dialogue = figures.dialogue
    assert dialogue.cut_fraction == round(sum(r.dialogue.dropped > 0 for r in reports) / n, 4)
    assert dialogue.kept_mean == round(sum(r.dialogue.kept for r in reports) / n, 3)
    assert dialogue.dropped_mean == round(sum(r.dialogue.dropped for r in reports) / n, 3)
    assert figures.episodic.duplicate_mean == round(sum(r.episodic.duplicate for r in reports) / n, 3) > 0
    budgeted = [r.dialogue.used / r.dialogue.budget for r in reports if r.dialogue.budget > 0]
    assert dialogue.used_fraction_mean == round(sum(budgeted) / len(budgeted), 4)
    mandatory = figures.mandatory
    assert mandatory.cut_fraction == 0.0  # canonical facts and world state are never cut with the flags on
    assert mandatory.used_fraction_mean == round(sum(r.mandatory_chars / 800 for r in reports) / n, 4)
    assert 0 < dialogue.cut_fraction < 1 and 0 < figures.over_budget_fraction < 1


def test_an_empty_tally_gives_zeros_not_an_error() -> None:
    figures = TruncationTally().figures()
    assert figures.snapshots == 0 and figures.dialogue.used_fraction_mean == 0.0


async def test_budgets_side_by_side_on_the_same_agents() -> None:
    """Same seed, same quota, one sweep process: both budgets see exactly the same snapshots."""
    memories = (WorkingMemoryConfig(max_context_chars=1000), WorkingMemoryConfig(max_context_chars=4000))
    result = await run_loadtest(
        LoadTestConfig(agents=400, requests=1500, duration_s=None, concurrency=0, processes=1, memory=memories)
    )
    small, large = result.budgets
    assert (small.max_context_chars, large.max_context_chars) == (1000, 4000)
    assert small.snapshots == large.snapshots == 1500 and result.snapshots == 3000
    assert small.violations == large.violations == result.violations == 0
    # The agents are sized against the smallest budget: the pathological ones fit in the larger.
    assert small.over_budget > 0 and large.over_budget == 0
    assert result.over_budget == small.over_budget
    # The mandatory part is the same text at both limits: a quarter as much of the larger one.
    m_small, m_large = small.truncation.mandatory.used_fraction_mean, large.truncation.mandatory.used_fraction_mean
    assert m_small == pytest.approx(4 * m_large, abs=1e-3)
    for category in ("dialogue", "episodic", "beliefs"):
        cut_small = getattr(small.truncation, category)
        cut_large = getattr(large.truncation, category)
        assert cut_large.kept_mean > cut_small.kept_mean
        assert cut_large.cut_fraction < cut_small.cut_fraction
    assert result.truncation.snapshots == 3000
    assert result.sweep == [] and small.knee_concurrency is None
    assert {p.max_context_chars for p in result.timeline} <= {1000, 4000}


def test_json_of_budgets_and_a_concurrency_list(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    code = main(["loadtest", "--agents", "100", "--requests", "40", "--processes", "0", "--concurrency", "2,4",
                 "--max-context-chars", "600,1500", "--json", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())
    assert [b["max_context_chars"] for b in figures["budgets"]] == [600, 1500]
    assert [(p["max_context_chars"], p["concurrency"]) for p in figures["sweep"]] == [
        (600, 2), (600, 4), (1500, 2), (1500, 4)
    ]
    assert figures["inferences"] == 160 and figures["violations"] == 0
    assert figures["max_context_chars"] == 600 and figures["concurrency"] == 2  # the first of each list
    for budget in figures["budgets"]:
        assert set(budget["truncation"]) == {"snapshots", "over_budget_fraction", "selections", *CATEGORIES}
        for category in CATEGORIES:
            assert set(budget["truncation"][category]) == TRUNCATION_KEYS
        assert budget["knee_concurrency"] in (2, None)
    for point in figures["sweep"]:
        assert point["inferences"] == 40 and point["fallbacks"] == 0
        assert point["prompt_tokens_per_s"] is None  # the scripted backend counts only its reply's words
        assert point["completion_tokens_per_s"] > 0


def test_token_budgets_pair_with_char_budgets(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    code = main(["loadtest", "--agents", "60", "--requests", "30", "--processes", "0", "--concurrency", "2",
                 "--max-context-chars", "3000", "--max-context-tokens", "200,400", "--json", str(out)])
    assert code == 0
    budgets = json.loads(out.read_text())["budgets"]
    assert [(b["max_context_chars"], b["max_context_tokens"]) for b in budgets] == [(3000, 200), (3000, 400)]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--max-context-chars", "1000,x"], "--max-context-chars"),
        (["--max-context-chars", "1000,,2000"], "--max-context-chars"),
        (["--max-context-chars", "1000,1000"], "--max-context-chars"),
        (["--max-context-chars", "1000,-5"], "--max-context-chars"),
        (["--max-context-tokens", "100,0"], "--max-context-tokens"),
        (["--concurrency", "4,"], "--concurrency"),
        (["--concurrency", "4,4"], "--concurrency"),
        (["--concurrency", "1e3"], "--concurrency"),
    ],
)
def test_bad_list_is_named(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    ran = npcsim_in_process(capsys, "loadtest", *argv)
    assert ran.code == 2
    assert named in ran.err and "Traceback" not in ran.err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--concurrency", "0,4"], "--concurrency"),
        (["--max-context-chars", "1000,2000", "--max-context-tokens", "100,200,300"], "--max-context-tokens"),
    ],
)
def test_bad_list_combination_is_named(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--requests", "5", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("points", "knee"),
    [
        ([(1, 10.0), (2, 20.0), (4, 40.0), (8, 42.0), (16, 41.0)], 4),
        ([(8, 42.0), (1, 10.0), (4, 40.0), (2, 20.0)], 4),  # any order
        ([(1, 10.0), (2, 10.5)], 1),
        ([(1, 10.0), (2, 20.0), (4, 9.0), (8, 40.0), (16, 41.0)], 8),  # a dip is not the knee
        ([(1, 10.0), (2, 11.5), (4, 13.0)], None),  # 10 % or more at each step: still rising
        ([(1, 10.0), (2, 20.0)], None),
        ([(4, 10.0)], None),
        ([], None),
        ([(1, 0.0), (2, 0.0)], None),  # nothing served: no curve, no knee
    ],
)
def test_knee(points: list[tuple[int, float]], knee: int | None) -> None:
    assert knee_concurrency(points) == knee


@pytest.mark.parametrize(
    "fields",
    [
        {"concurrency": ()},
        {"concurrency": (4, 4)},
        {"concurrency": (0, 4)},
        {"concurrency": (-1, 4)},
        {"memory": ()},
    ],
)
def test_bad_lists_are_refused_by_the_config(fields: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        LoadTestConfig(processes=1, **fields)  # type: ignore[arg-type]


def test_the_live_line_names_the_phase() -> None:
    progress = Progress(
        elapsed_s=1.0, planned_s=10.0, requests=None, snapshots=5, snapshots_per_s=5.0, inferences=1,
        inferences_per_s=1.0, violations=0, over_budget=0, fallbacks=0, rss_mb=10.0,
        phase="1000 chars, concurrency 4 [1/2]",
    )
    assert "1000 chars, concurrency 4 [1/2]" in progress_view(progress).plain


async def test_the_live_counts_never_go_back_across_phases() -> None:
    """Counts are the run's, not the phase's: the metrics endpoint exports them as counters."""
    seen: list[Progress] = []
    memories = (WorkingMemoryConfig(max_context_chars=800), WorkingMemoryConfig(max_context_chars=1600))
    await run_loadtest(
        LoadTestConfig(agents=100, duration_s=2.5, concurrency=4, processes=0, memory=memories),
        on_progress=seen.append,
    )
    assert {p.phase.split(",")[0] for p in seen} == {"800 chars", "1600 chars"}
    for field in ("snapshots", "inferences", "over_budget"):
        values = [getattr(p, field) for p in seen]
        assert values == sorted(values), field
