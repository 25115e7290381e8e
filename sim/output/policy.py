"""What the scenario's author allows an NPC to say and propose, and what the gates said of
each part of a reply (docs/npc-output.md). Pure types: the audit record keeps both (sim.audit),
the request carries the policy to the worker, and the gates (sim.output.gates) apply it."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["Arg", "ArgType", "OutputPolicy", "ProposalVerdict"]

Arg = str | int | float | bool  # an intent's argument
ArgType = Literal["string", "integer", "number", "boolean"]  # what an intent's argument may be


class OutputPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an NPC may say and propose, as its scenario's author wrote it (docs/npc-output.md).

    `structured`: a structured reply, not a line; `forbidden`: phrases it must never reveal;
    `intents`: those it may propose, with their arguments' types; `max_beliefs`,
    `max_memories`: at most this many a turn. The request carries it to the worker, the
    record keeps it for replaying the gates (sim.output applies it).
    """

    structured: bool = False
    forbidden: tuple[str, ...] = ()
    intents: dict[str, dict[str, ArgType]] = {}
    max_beliefs: int = 3
    max_memories: int = 3


class ProposalVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """One part of a reply and what the gates made of it (sim.output, docs/npc-output.md).

    `kind` is "line", "belief", "memory" or "intent"; `text` the line, the belief's or the
    memory's text (cleaned), or the intent's name; `verdict` "accepted" or "rejected";
    `code` the first gate that refused it ("ok" when accepted), `detail` why. `about`,
    `weight` (confidence or significance, clamped) and `args` are the proposal's other fields.
    """

    kind: str
    text: str
    verdict: str
    code: str
    detail: str = ""
    about: str = ""
    weight: float = 0.0
    args: dict[str, Arg] = {}
