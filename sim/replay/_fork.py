"""How a fork differs from its original: where the lines first diverge, and by how much after.

Before the fork's tick the fork is a re-execution, so its records must be the original's
(`before` is the first divergence there, None when there is none). From that tick on the
two runs are compared side by side: the first record whose line differs (or that one run
alone has), how many lines differ, and each run's fallbacks, over-budget working memories
and latency (the pool's `total_ms`, mean and 95th percentile).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

import msgspec

from sim.audit import AuditRecord
from sim.replay._compare import Divergence, compare_records

__all__ = ["ForkReport", "RunFigures", "fork_report"]


class RunFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One run's inferences from the fork's tick on."""

    inferences: int
    fallbacks: int
    over_budget: int
    latency_ms_mean: float
    latency_ms_p95: float


class ForkReport(msgspec.Struct, frozen=True, kw_only=True):
    fork_at: int
    identical_before: int  # records before the fork's tick, compared
    before: Divergence | None  # a divergence before the fork's tick: the fork is not the original's there
    first: Divergence | None  # the first line that differs from the fork's tick on
    lines_differing: int  # inferences of one run only, or whose lines differ
    original: RunFigures
    fork: RunFigures


def fork_report(original: Mapping[str, AuditRecord], fork: Mapping[str, AuditRecord], fork_at: int) -> ForkReport:
    early = {k: r for k, r in original.items() if r.tick < fork_at}
    before = compare_records(early, {k: r for k, r in fork.items() if r.tick < fork_at})
    late_a = {k: r for k, r in original.items() if r.tick >= fork_at}
    late_b = {k: r for k, r in fork.items() if r.tick >= fork_at}
    differing = sorted(
        (r for k in {*late_a, *late_b} if (late_a.get(k) is None or late_b.get(k) is None
                                           or late_a[k].line != late_b[k].line)
         for r in [late_a.get(k) or late_b[k]]),
        key=lambda r: (r.tick, r.agent_id, r.id),
    )
    first = None
    if differing:
        r = differing[0]
        a, b = late_a.get(r.id), late_b.get(r.id)
        if a is not None and b is not None:
            what = f"said {b.line!r} where the original said {a.line!r}"
        elif a is not None:
            what = f"the original said {a.line!r}; the fork made no such inference"
        else:
            assert b is not None
            what = f"the fork said {b.line!r}; the original made no such inference"
        first = Divergence(tick=r.tick, npc=r.agent_id, what=what)
    return ForkReport(
        fork_at=fork_at, identical_before=len(early), before=before, first=first, lines_differing=len(differing),
        original=_figures(late_a), fork=_figures(late_b),
    )


def _figures(records: Mapping[str, AuditRecord]) -> RunFigures:
    latencies = sorted(r.timings.get("total_ms", 0.0) for r in records.values())
    p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))] if latencies else 0.0
    return RunFigures(
        inferences=len(records),
        fallbacks=sum(r.fallback for r in records.values()),
        over_budget=sum(r.report.over_budget for r in records.values()),
        latency_ms_mean=statistics.fmean(latencies) if latencies else 0.0,
        latency_ms_p95=p95,
    )
