"""The pure core: NPC state, ephemeral working memory with priority truncation.

No I/O happens here, and nothing here imports the I/O layers; a tokenizer's vocabulary is
read once per process (cl100k's from its package, a GGUF's from its file). A server's
token counts are fetched by the layer that talks to it and handed to the build
(`build_working_memory(..., counts=...)`); a text they lack stops the build with
`CountsMissing`, which names what to fetch before building again (`sim.memory._tokens`).
The prompt's format, piece by piece (for whoever re-renders or
measures a prompt on its own: the checker, tests, benchmarks), is the public module
`sim.memory.render`; its docstring says why it is a module of its own.
`explain_truncation` names every item a working memory dropped and why, derived from the
snapshot (the report it explains is all that audit records keep).
`distinct` is the state a working memory chooses from: no memory that a line of its
dialogue says already; `leave_out_event` the state a line is answered from (the line is
the input). `ranking` is a scored selection's order of each flexible category among those
candidates (`selection = "scored"` in the config).
`quoted` and `own_words` are how a remembered line is quoted: one level, never a quote in
a quote (the NPC brain and the scripted backend both retell what was said).
`recall` is what an NPC brings back, for an input, from what it kept of its whole history
(its significant episodes, its place's `summary_of` its talk); `recalled_for` the one rule a
run and `memory show` recall by, `hot_and_kept` a whole history as a run holds it, and
`with_recalled` the state with what was recalled, what a scored selection with `recall`
ranks (`sim.memory._recall`).
`prefix_reuse` is how much of a prompt is a prefix of the previous one (what a model
server's prompt cache can reuse); the builder remembers no previous prompt, so the recorder
and the audit compute it.
"""

from sim.errors import OverBudgetError
from sim.memory import render
from sim.memory._budget import SELECTIONS, ScoredSelection, Selection, WorkingMemoryConfig, counted_by_server
from sim.memory._build import CategoryReport, TruncationReport, WorkingMemory, build_working_memory
from sim.memory._duplicates import Distinct, distinct, leave_out_event
from sim.memory._explain import (
    DROP_REASONS,
    CategoryExplanation,
    DroppedItem,
    DropReason,
    TruncationExplanation,
    explain_truncation,
)
from sim.memory._quotes import QUOTE_MARKS, own_words, quoted
from sim.memory._recall import (
    FOLD_EVENTS,
    KEEP_SIGNIFICANCE,
    MAX_KEPT,
    MAX_SUMMARIES,
    hot_and_kept,
    kept_rank,
    recall,
    recalled_for,
    strength,
    summary_of,
    with_recalled,
)
from sim.memory._reuse import PrefixReuse, prefix_reuse
from sim.memory._scoring import ranking
from sim.memory._state import (
    Belief,
    Episode,
    Fact,
    Line,
    NpcState,
    WorldFact,
    belief_order,
    episode_order,
    fact_order,
    line_order,
    world_order,
)
from sim.memory._tokens import TOKENIZER_FORMS, TOKENIZERS, CountsMissing, TokenCounter, token_counter
from sim.memory.render import RENDERER_VERSION, inert

__all__ = [
    "Belief",
    "CategoryExplanation",
    "CategoryReport",
    "CountsMissing",
    "DROP_REASONS",
    "FOLD_EVENTS",
    "KEEP_SIGNIFICANCE",
    "MAX_KEPT",
    "MAX_SUMMARIES",
    "Distinct",
    "DropReason",
    "DroppedItem",
    "Episode",
    "Fact",
    "Line",
    "NpcState",
    "OverBudgetError",
    "PrefixReuse",
    "QUOTE_MARKS",
    "RENDERER_VERSION",
    "SELECTIONS",
    "ScoredSelection",
    "Selection",
    "TOKENIZERS",
    "TOKENIZER_FORMS",
    "TokenCounter",
    "TruncationExplanation",
    "TruncationReport",
    "WorkingMemory",
    "WorkingMemoryConfig",
    "WorldFact",
    "belief_order",
    "build_working_memory",
    "counted_by_server",
    "distinct",
    "episode_order",
    "explain_truncation",
    "fact_order",
    "inert",
    "hot_and_kept",
    "kept_rank",
    "leave_out_event",
    "line_order",
    "own_words",
    "prefix_reuse",
    "quoted",
    "ranking",
    "recall",
    "recalled_for",
    "render",
    "strength",
    "summary_of",
    "token_counter",
    "with_recalled",
    "world_order",
]
