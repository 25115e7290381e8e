"""Passes over a recorded run: the what-if of `npcsim replay --set`, and the machinery that
spreads a pass over the audit records on every core (`npcsim audit replay` uses it too).

    plan = plan_spans(["village.db"], jobs=2)
    tallies = map_spans(replay_records, plan, jobs=2)   # one per span, in record order

`what_if` rebuilds each record's stored snapshot under other working-memory configs (the
world unfolds as recorded; only what each model call would have seen changes) and counts
what each one lost and gained against the original; `parse_overrides` reads `--set`.
"""

from sim.replay._overrides import MAX_VARIANTS, SETTABLE, Override, Variant, parse_overrides
from sim.replay._parallel import Plan, Span, check_jobs, default_jobs, map_spans, plan_spans
from sim.replay._plot import write_plot
from sim.replay._whatif import CATEGORIES, Change, Tally, what_if

__all__ = [
    "CATEGORIES",
    "MAX_VARIANTS",
    "SETTABLE",
    "Change",
    "Override",
    "Plan",
    "Span",
    "Tally",
    "Variant",
    "check_jobs",
    "default_jobs",
    "map_spans",
    "parse_overrides",
    "plan_spans",
    "what_if",
    "write_plot",
]
