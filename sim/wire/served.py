"""What a model server said of one call: what it cost (`Usage`) and which model answered
(`ServedBy`). Carried in each attempt of an inference result across the pipes and MQTT
(sim.wire.inference), and kept in the audit record (sim.audit); each field None where the
server said nothing, never guessed."""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["ServedBy", "Usage"]

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
