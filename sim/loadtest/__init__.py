"""`npcsim loadtest`: prove priority truncation holds under concurrency, at scale.

Seeded random agents (`_states`), a build-and-check sweep over the cores plus a round trip
through the inference pool (`_run`), figures (`_stats`), a live display (`_display`) and an
optional plot (`_plot`).
"""

from sim.loadtest._run import Builder, Checker, LoadTestConfig, Progress, default_processes, run_loadtest
from sim.loadtest._states import PATHOLOGICAL_SHARE, PROFILES, agent_id, generate_state, profile_of
from sim.loadtest._stats import LatencyFigures, LoadTestResult, TimelinePoint, ViolationRecord

__all__ = [
    "Builder",
    "Checker",
    "LatencyFigures",
    "LoadTestConfig",
    "LoadTestResult",
    "PATHOLOGICAL_SHARE",
    "PROFILES",
    "Progress",
    "TimelinePoint",
    "ViolationRecord",
    "agent_id",
    "default_processes",
    "generate_state",
    "profile_of",
    "run_loadtest",
]
