"""A working memory's budget (`WorkingMemoryConfig`); the tokenizers it may be counted with are
`sim.memory._tokens`'s."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import msgspec

from sim.errors import ConfigError
from sim.memory._tokens import SERVER, TOKENIZERS, check_tokenizer, token_counter

__all__ = ["LAYOUTS", "SELECTIONS", "Layout", "OverflowPolicy", "ScoredSelection", "Selection", "WorkingMemoryConfig",
           "counted_by_server"]

OverflowPolicy = Literal["keep", "raise"]
Selection = Literal["recency", "scored"]
SELECTIONS: tuple[Selection, ...] = ("recency", "scored")
Layout = Literal["sections", "log"]
LAYOUTS: tuple[Layout, ...] = ("sections", "log")

_SHARE_TOLERANCE = 1e-9
MAX_RECALL = 64
"""The most kept memories one input may retrieve: more than any prompt's caps could use."""


def _require_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a whole number >= 0, got {value!r}")


def _in_unit_interval(value: float) -> bool:
    return 0.0 <= value <= 1.0


def _require_number(name: str, value: object, wanted: str, holds: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not holds(value):
        raise ConfigError(f"{name} must be {wanted}, got {value!r}")


class ScoredSelection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How `selection = "scored"` ranks a category's items (`sim.memory._scoring`): recency
    halving every `half_life_ticks` (slower the more important the item), importance
    (`dialogue_importance` for a line of dialogue) and relevance to the input, weighted. Read
    only by that selection ([memory.scored] in a scenario). `recall` is how many of the NPC's
    kept memories (its significant episodes and its place's summaries, from its whole
    history: `sim.memory._recall`) are retrieved for each input and ranked with the hot
    state; 0 ranks the hot state alone."""

    half_life_ticks: float = 20.0
    recency_weight: float = 1.0
    importance_weight: float = 1.0
    relevance_weight: float = 1.0
    dialogue_importance: float = 0.5
    recall: int = 0

    def __post_init__(self) -> None:
        _require_count("recall", self.recall)
        if self.recall > MAX_RECALL:
            raise ConfigError(f"recall must be at most {MAX_RECALL} (memories retrieved per input), got {self.recall}")
        for name in ("recency_weight", "importance_weight", "relevance_weight"):
            _require_number(name, getattr(self, name), "a number >= 0", lambda x: x >= 0.0)
        _require_number("half_life_ticks", self.half_life_ticks, "a number > 0", lambda x: x > 0.0)
        _require_number("dialogue_importance", self.dialogue_importance, "a number from 0 to 1", _in_unit_interval)


class WorkingMemoryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a working memory is built. A bad value is refused here, naming field and value.

    `max_context_chars` counts Unicode code points of the rendered prompt. With
    `max_context_tokens` set the prompt must fit that too, counted with `tokenizer`
    ("cl100k", "server" or "gguf:PATH": `sim.memory._tokens`).
    `selection` is how a flexible category ranks its items: "recency" (newest first) or
    "scored" (best ranked first, as `scored` says). `stable_prefix` moves the start of each flexible category's kept run
    only in steps (`sim.memory._stable`), so that successive prompts extend each other.
    `layout` is the prompt's shape: "sections" (one section per category, the seed's) or
    "log" (the dialogue and memories as one chronological log that a later prompt extends:
    `sim.memory._log`).
    """

    max_context_chars: int = 2000
    max_context_tokens: int | None = None
    tokenizer: str = "cl100k"
    max_dialogue_lines: int = 10
    max_episodic_memories: int = 5
    max_beliefs: int = 3
    always_include_canonical_facts: bool = True
    always_include_world_state: bool = True
    dialogue_share: float = 0.60
    episodic_share: float = 0.25
    belief_share: float = 0.15
    redistribute_unused: bool = True
    on_overflow: OverflowPolicy = "keep"
    selection: Selection = "recency"
    scored: ScoredSelection = ScoredSelection()
    stable_prefix: bool = False
    layout: Layout = "sections"

    def __post_init__(self) -> None:
        for name in ("max_context_chars", "max_dialogue_lines", "max_episodic_memories", "max_beliefs"):
            _require_count(name, getattr(self, name))
        if self.max_context_tokens is not None:
            _require_count("max_context_tokens", self.max_context_tokens)
        for name in ("always_include_canonical_facts", "always_include_world_state", "redistribute_unused",
                     "stable_prefix"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
        shares = {n: getattr(self, n) for n in ("dialogue_share", "episodic_share", "belief_share")}
        for name, share in shares.items():
            _require_number(name, share, "a number from 0 to 1", _in_unit_interval)
        total = sum(shares.values())
        if total > 1.0 + _SHARE_TOLERANCE:
            listed = ", ".join(f"{n}={v!r}" for n, v in shares.items())
            raise ConfigError(
                f"dialogue_share + episodic_share + belief_share must be <= 1, got {total:.6g} ({listed})"
            )
        if self.on_overflow not in ("keep", "raise"):
            raise ConfigError(f"on_overflow must be 'keep' or 'raise', got {self.on_overflow!r}")
        if self.selection not in SELECTIONS:
            raise ConfigError(f"selection must be 'recency' or 'scored', got {self.selection!r}")
        if not isinstance(self.scored, ScoredSelection):
            raise ConfigError(f"scored must be a table of the scored selection's settings, got {self.scored!r}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be 'sections' or 'log', got {self.layout!r}")
        if self.layout == "log" and self.stable_prefix:
            raise ConfigError("stable_prefix is the sections layout's: layout = \"log\" moves the log's start "
                              "in chunks already; leave stable_prefix false")
        check_tokenizer(self.tokenizer)
        if self.max_context_tokens is not None and self.tokenizer in TOKENIZERS:
            # refuse now, not at the first build, when the extra is missing; a model's own
            # tokenizer is opened with the run (a record naming one must decode without it)
            token_counter(self.tokenizer)



def counted_by_server(config: WorkingMemoryConfig) -> bool:
    """Whether `config`'s token budget is counted by a server (`tokenizer = "server"`): its
    counts are fetched by the I/O layer and handed to the build."""
    return config.max_context_tokens is not None and config.tokenizer == SERVER
