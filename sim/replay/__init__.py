"""A recorded run, taken up again: executed again (`npcsim replay`), forked, or its snapshots
rebuilt under other working-memory settings (the what-if of `npcsim replay --set`).

    recording = load_recording(["run.shard0.db", "run.shard1.db"])   # every store of the run
    executed = await execute(recording, Path("again.db"))           # from tick 0, recorded replies
    comparison = compare(recording, executed)                       # the first divergence, or none
    forked = await execute(recording, Path("fork.db"), fork_at=40, backend="openai", backend_options=...)

    plan = plan_spans(["village.db"], jobs=2)
    tallies = map_spans(replay_records, plan, jobs=2)   # one per span, in record order

- `_recording`: `Recording`, `load_recording`: what a re-execution needs, read from a run's
  stores and checked (one run, every shard, schema 6);
- `_rerun`: `execute`: the run again in this process on a `LocalBroker`, one shard, the
  recorded inputs and world-state changes at their ticks, every inference answered with its
  recorded replies (before `fork_at`; after it, live on the backend given);
- `_compare`: the first divergence of the audit records and the final states;
- `_fork`: how a fork differs from its original from the fork's tick on;
- `_whatif`, `_overrides`: each record's stored snapshot rebuilt under other configs (the
  world unfolds as recorded; only what each model call would have seen changes), what each
  one lost and gained, drawn by `write_plot`; `parse_overrides` reads `--set`;
- `_flips`: under a variant's output policy (`--set npc.ID.forbidden=...`), each recorded
  reply judged again by the gates, and the parts whose verdict flips;
- `_parallel`: a pass over the audit records spread on every core (`npcsim audit replay`
  uses it too).
See docs/replay.md.
"""

from sim.replay._compare import Comparison, Divergence, compare_records, compare_states, records_of
from sim.replay._flips import Flip
from sim.replay._fork import ForkReport, RunFigures, fork_report
from sim.replay._overrides import MAX_VARIANTS, MEMORY, POLICY_KEYS, Override, Variant, parse_overrides
from sim.replay._parallel import Plan, Span, check_jobs, default_jobs, map_spans, plan_spans
from sim.replay._recording import Recording, load_recording
from sim.replay._rerun import Executed, execute
from sim.replay._whatif import CATEGORIES, Change, Tally, what_if, write_plot

__all__ = [
    "CATEGORIES",
    "MAX_VARIANTS",
    "MEMORY",
    "POLICY_KEYS",
    "Change",
    "Comparison",
    "Divergence",
    "Executed",
    "Flip",
    "ForkReport",
    "Override",
    "Plan",
    "Recording",
    "RunFigures",
    "Span",
    "Tally",
    "Variant",
    "check_jobs",
    "compare",
    "default_jobs",
    "execute",
    "fork_report",
    "load_recording",
    "map_spans",
    "parse_overrides",
    "plan_spans",
    "records_of",
    "what_if",
    "write_plot",
]


def compare(recording: Recording, executed: Executed) -> Comparison:
    """The re-execution against its original: every audit record of the ticks it ran, then,
    when it ran to the original's end, every NPC's final state."""
    original = {k: r for k, r in recording.records.items() if r.tick < executed.end}
    again = records_of([executed.out])
    divergence = compare_records(original, again)
    npcs = 0
    if divergence is None and executed.end == recording.last_tick + 1:
        npcs, divergence = compare_states(recording.paths, executed.out)
    return Comparison(records=len(original), npcs=npcs, divergence=divergence)
