"""`npcsim loadtest`: prove priority truncation holds under concurrency, at scale.

Seeded random agents (`_states`); a build-and-check sweep over the cores in helper processes
(`_sweep`, `_sweep_worker`, speaking the typed messages of `_messages`) plus a round trip
through the inference pool (`_round_trip`, `_inference`, `_mqtt_worker`), side by side in
each (budget, concurrency) phase (`_phase`), the phases in order (`_run`); the
plan and what its phases share (`_plan`), one snapshot built and checked (`_snapshot`), the
proposing agents and their attackers of `--output structured` (`_proposals`), what a phase
counted (`_totals`), figures (`_stats`), truncation statistics (`_truncation`), a live
display (`_display`) and an optional plot (`_plot`). See docs/loadtest.md.
"""

from sim.loadtest._display import Cell, Section, progress_view, result_sections
from sim.loadtest._plan import LoadTestConfig, default_processes
from sim.loadtest._plot import require_matplotlib, write_plot
from sim.loadtest._proposals import OUTPUTS
from sim.loadtest._run import run_loadtest
from sim.loadtest._snapshot import Builder, Checker
from sim.loadtest._states import PATHOLOGICAL_SHARE, PROFILES, agent_id, generate_state, profile_of
from sim.loadtest._stats import (
    KNEE_GAIN,
    BudgetResult,
    LatencyFigures,
    LoadTestResult,
    Progress,
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
    "Cell",
    "Checker",
    "LatencyFigures",
    "LoadTestConfig",
    "LoadTestResult",
    "OUTPUTS",
    "PATHOLOGICAL_SHARE",
    "PROFILES",
    "Progress",
    "SweepPoint",
    "TimelinePoint",
    "TruncationFigures",
    "TruncationTally",
    "Section",
    "ViolationRecord",
    "agent_id",
    "default_processes",
    "generate_state",
    "knee_concurrency",
    "profile_of",
    "progress_view",
    "result_sections",
    "require_matplotlib",
    "run_loadtest",
    "write_plot",
]
