"""One call to a backend and what was judged of it: the value types the wire, the audit and
the judge (sim.output) share, in one leaf module that imports nothing of npcsim.

- `Usage` and `ServedBy`: what a model server said of one call (its cost, the model that
  answered), each field None where the server said nothing, never guessed;
- `OutputPolicy` and `Rules`: what a reply is judged under: the NPC's policy as its
  scenario's author wrote it, and the run's rules around it (the line limit, the fact guard);
- `ProposalVerdict`: what the gates said of one part of a reply;
- `Attempt`: one call, with its prompt, its reply, its problem and its verdicts.

An inference result carries its attempts across the pipes and MQTT (sim.wire.inference),
the audit record keeps them and the rules (sim.audit), and sim.output judges by them.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "MAX_LINE_CHARS",
    "Arg",
    "ArgSpec",
    "ArgType",
    "WorldValues",
    "Attempt",
    "OutputPolicy",
    "ProposalVerdict",
    "Rules",
    "ServedBy",
    "Usage",
]

Count = Annotated[int, msgspec.Meta(ge=0)]
Millis = Annotated[float, msgspec.Meta(ge=0)]


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """What the server said one call cost; None where it said nothing.

    `prompt_tokens` counts the whole prompt as the server tokenized it, `cached_tokens`
    those of them it reused from its cache instead of evaluating them again (so
    `prompt_tokens - cached_tokens` were evaluated). `prompt_ms` and `predicted_ms` are the
    server's own times for evaluating the prompt and for generating.
    """

    prompt_tokens: Count | None = None
    cached_tokens: Count | None = None
    completion_tokens: Count | None = None
    prompt_ms: Millis | None = None
    predicted_ms: Millis | None = None

    @property
    def evaluated_tokens(self) -> int | None:
        """The prompt tokens the server evaluated: None unless it said how many and how many of
        them were reused (no more than there were)."""
        if self.prompt_tokens is None or self.cached_tokens is None or self.cached_tokens > self.prompt_tokens:
            return None
        return self.prompt_tokens - self.cached_tokens

    @property
    def served_ms(self) -> float | None:
        """The server's own time for the call (evaluating the prompt and generating): None
        unless it said both; what the call's latency had besides it was spent waiting."""
        if self.prompt_ms is None or self.predicted_ms is None:
            return None
        return self.prompt_ms + self.predicted_ms


class ServedBy(msgspec.Struct, frozen=True, kw_only=True):
    """Which model answered a call; None where the backend cannot say.

    `model` is the server's own id for the model (an OpenAI-compatible reply's `model`),
    `build` the server's build (llama.cpp's `build_info`, or a reply's `system_fingerprint`),
    `sha256` the model file's digest where npcsim loaded the file itself (`llamacpp`),
    `server` the base URL of the server that answered (`openai`; one of several, docs/inference.md).
    """

    model: str | None = None
    build: str | None = None
    sha256: str | None = None
    server: str | None = None

    def differs(self, other: ServedBy) -> bool:
        """Whether `other` is another model: a field both name differs (saying nothing differs in nothing)."""
        pairs = zip(msgspec.structs.astuple(self), msgspec.structs.astuple(other), strict=True)
        return any(a is not None and b is not None and a != b for a, b in pairs)


Arg = str | int | float | bool  # an intent's argument
ArgType = Literal["string", "integer", "number", "boolean"]  # what an intent's argument may be


class WorldValues(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An argument limited to the values the NPC's world-state entry `world` lists when it
    proposes (comma-separated): a list the game keeps current, such as what the innkeeper has
    (`item = { world = "stock" }`)."""

    world: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,128}\Z")]


ArgSpec = ArgType | tuple[str, ...] | WorldValues
"""An argument as an allow-list gives it: its type, the strings it may be (the only ones), or
the values a world-state entry of the NPC lists."""


class OutputPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an NPC may say and propose, as its scenario's author wrote it (docs/npc-output.md).

    `structured`: a structured reply, not a line; `forbidden`: phrases it must never reveal;
    `intents`: those it may propose, with their arguments' types or values; `max_beliefs`,
    `max_memories`: at most this many a turn. The request carries it to the worker, the
    record keeps it for replaying the gates (sim.output applies it).
    """

    structured: bool = False
    forbidden: tuple[str, ...] = ()
    intents: dict[str, dict[str, ArgSpec]] = {}
    max_beliefs: int = 3
    max_memories: int = 3


MAX_LINE_CHARS = 200
"""A spoken line, at most (characters, once cleaned): `Rules`' default, and the pool's."""


class Rules(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything a reply is judged under (sim.output.judge_reply), as one value.

    `max_line_chars` bounds the spoken line; `fact_guard` names the fact guard as
    `module:attribute` ("" is the built-in one, sim.output.contradicted_fact); `output` is
    the NPC's output policy (None: a line, no gates). An audit record keeps the run's rules
    (its `output` apart, in the record's own field), so a replay judges as the run did.
    """

    max_line_chars: int = MAX_LINE_CHARS
    fact_guard: str = ""
    output: OutputPolicy | None = None


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


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    """One call to a backend: what the model was given, what came back, what was wrong.

    `prompt` is `prefix` + the working memory's text in `form` ("text": the prompt; "chat":
    the messages' contents joined by a blank line); the memory is the record's, rebuilt
    with `prohibition`. `problem` is None when the reply was accepted. `proposals` are the
    gates' verdicts on the reply's parts (none for an NPC without an output policy). `usage`
    and `served_by` are None when no reply came.
    """

    prompt: str
    raw_response: str | None = None
    problem: str | None = None
    prohibition: str | None = None
    form: str = "text"
    prefix: str = ""
    proposals: tuple[ProposalVerdict, ...] = ()
    usage: Usage | None = None
    served_by: ServedBy | None = None
