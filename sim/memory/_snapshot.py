"""A working memory and its truncation report: what a build gives, whichever layout made it.

Shared by the two builders (`sim.memory._build`, the sections; `sim.memory._log`, the log),
with the reports of one category's choice (`category_report`) they both make.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sim.errors import ConfigError
from sim.memory._budget import Selection, WorkingMemoryConfig
from sim.memory._selection import Category
from sim.memory._state import Belief, Episode, Fact, Line, WorldFact

__all__ = ["CategoryReport", "TruncationReport", "WorkingMemory", "category_report", "kept_items",
           "over_budget_message"]


class CategoryReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one category was given and what it kept; sizes in characters (and tokens).

    `dropped` counts the items truncation left out (cap, budget, over budget, stable prefix);
    `duplicate` the memories left out because a line the dialogue keeps says them already
    (`sim.memory._duplicates`): kept + dropped + duplicate is the state's count, and a memory
    whose line is not kept is never a duplicate.

    `budget` is the category's share of the flexible budget (for a truncatable
    always-include category: what was left); `used` may exceed it when unused budget
    was redistributed.
    """

    budget: int
    used: int
    kept: int
    dropped: int
    duplicate: int = 0
    budget_tokens: int | None = None
    used_tokens: int | None = None


class TruncationReport(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the budget did to one working memory; `selection` names how the flexible
    categories chose (left out of the encoding when it is the default, "recency").

    `stable_cost_chars` is what `stable_prefix` cost: the characters of the items the
    ordinary selection kept and the stable start gave up (counted in their categories'
    `dropped`; left out of the encoding when 0).
    """

    limit_chars: int
    limit_tokens: int | None
    mandatory_chars: int
    mandatory_tokens: int | None
    prompt_chars: int
    prompt_tokens: int | None
    over_budget: bool
    canonical_facts: CategoryReport
    world_state: CategoryReport
    dialogue: CategoryReport
    episodic: CategoryReport
    beliefs: CategoryReport
    selection: Selection = "recency"
    stable_cost_chars: int = 0


class WorkingMemory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One inference's context. Kept items are the state's own items, oldest first.

    `prohibition` is a retry's rule (mandatory content, rendered in the prompt).
    `renderer` names the rendering that made the prompt (`RENDERER_VERSION`); it is part
    of the encoding an audit record's digest covers. `prompt[:system_chars]` is the
    author's text: the system prompt and the canonical facts.
    """

    agent_id: str
    player_input: str
    prompt: str
    context_chars: int  # prompt[:context_chars] is everything before the "## Now" part
    canonical_facts: tuple[Fact, ...]
    world_state: tuple[WorldFact, ...]
    dialogue: tuple[Line, ...]
    episodic: tuple[Episode, ...]
    beliefs: tuple[Belief, ...]
    report: TruncationReport
    prohibition: str | None = None
    renderer: int
    system_chars: int

    def messages(self) -> list[dict[str, str]]:
        """The same content in chat form: a system message and a user message.

        The system message is the author's text only (the system prompt and the canonical
        facts); everything that carries outside words (world state, which the game system
        changes over MQTT, beliefs, memories, dialogue, a retry's rule and the input) is
        the user message, the prompt's text up to its closing cue.
        """
        cue = len(self.prompt) - len(self.agent_id) - 1  # the prompt ends with "{agent_id}:"
        return [
            {"role": "system", "content": self.prompt[: self.system_chars].removesuffix("\n")},
            {"role": "user", "content": self.prompt[self.system_chars : cue].removeprefix("\n").removesuffix("\n")},
        ]

    def sent_text(self, form: str) -> str:
        """What a model is given, as the audit records it: the prompt ("text"), or for the
        chat endpoint ("chat") the messages' contents in order, joined by a blank line."""
        if form == "chat":
            return "\n\n".join(m["content"] for m in self.messages())
        if form == "text":
            return self.prompt
        raise ConfigError(f"form must be 'text' or 'chat', got {form!r}")


def kept_items(items: tuple[Any, ...], category: Category) -> tuple[Any, ...]:
    """The kept items, oldest first."""
    k = category.kept
    if category.rank is not None:
        return tuple([items[p] for p in category.kept_positions()])
    return items[len(items) - k :] if k else ()


def category_report(category: Category, duplicate: int = 0) -> CategoryReport:
    section, k = category.section, category.kept
    used = (len(section.header) + category.sums[k]) if k else 0
    budget = used if category.always else category.budget[0]
    dropped = len(section.lines) - k - duplicate
    if category.token_sums is None:
        return CategoryReport(budget=budget, used=used, kept=k, dropped=dropped, duplicate=duplicate)
    used_tokens = (category.token_header + category.token_sums[k]) if k else 0
    return CategoryReport(
        budget=budget,
        used=used,
        kept=k,
        dropped=dropped,
        duplicate=duplicate,
        budget_tokens=used_tokens if category.always else category.budget[1],
        used_tokens=used_tokens,
    )


def over_budget_message(
    agent_id: str, cfg: WorkingMemoryConfig, mandatory_chars: int, mandatory_tokens: int | None
) -> str:
    parts = [f"{mandatory_chars} characters against max_context_chars={cfg.max_context_chars}"]
    if mandatory_tokens is not None:
        parts.append(f"{mandatory_tokens} tokens against max_context_tokens={cfg.max_context_tokens}")
    return (
        f"working memory for agent {agent_id!r}: the mandatory content (system prompt, input, "
        f"canonical facts, world state, a retry's rule) alone is {' and '.join(parts)}; on_overflow='raise'"
    )
