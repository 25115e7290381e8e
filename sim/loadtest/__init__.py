"""`npcsim loadtest`: prove priority truncation holds under concurrency, at scale.

Seeded random agents (`_states`), a build-and-check sweep over the cores plus a round trip
through the inference pool (`_run`), run once per (budget, concurrency) phase; figures
(`_stats`), truncation statistics (`_truncation`), a live display (`_display`) and an
optional plot (`_plot`). See docs/loadtest.md.
"""

from sim.loadtest._display import print_result, progress_view
from sim.loadtest._plot import require_matplotlib, write_plot
from sim.loadtest._run import Builder, Checker, LoadTestConfig, Progress, default_processes, run_loadtest
from sim.loadtest._states import PATHOLOGICAL_SHARE, PROFILES, agent_id, generate_state, profile_of
from sim.loadtest._stats import (
    KNEE_GAIN,
    BudgetResult,
    LatencyFigures,
    LoadTestResult,
    SweepPoint,
    TimelinePoint,
    ViolationRecord,
    knee_concurrency,
)
from sim.loadtest._truncation import CATEGORIES, CategoryTruncation, TruncationFigures, TruncationTally

__all__ = [
    "CATEGORIES",
    "KNEE_GAIN",
    "BudgetResult",
    "Builder",
    "CategoryTruncation",
    "Checker",
    "LatencyFigures",
    "LoadTestConfig",
    "LoadTestResult",
    "PATHOLOGICAL_SHARE",
    "PROFILES",
    "Progress",
    "SweepPoint",
    "TimelinePoint",
    "TruncationFigures",
    "TruncationTally",
    "ViolationRecord",
    "agent_id",
    "default_processes",
    "generate_state",
    "knee_concurrency",
    "print_result",
    "profile_of",
    "progress_view",
    "require_matplotlib",
    "run_loadtest",
    "write_plot",
]
