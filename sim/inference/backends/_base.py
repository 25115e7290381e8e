"""The contract every backend keeps: `Backend`, its `Reply`, its options, its prompt.

A backend sends the working memory as `sim.memory` rendered it, in one of the
`PROMPT_FORMS`, and adds nothing to it but one of the fixed `PROMPT_PREFIXES`. The audit
records that exact text, and the pool holds a remote worker's attempts to it
(`sim.inference._replies`): so the prefixes live here, where the backends and the pool's
reply checks both read them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import msgspec

from sim.errors import ConfigError
from sim.memory import WorkingMemory
from sim.wire.attempt import ServedBy, Usage

__all__ = [
    "FEW_SHOT", "PROMPT_FORMS", "PROMPT_PREFIXES", "Backend", "Limited", "Reply", "Tokenizer", "Tokenizing",
    "convert_options",
]

T = TypeVar("T")

# The llamacpp backend's few-shot preamble: fixed, so it is a prefix llama.cpp can reuse from its cache.
FEW_SHOT = (
    "Each character answers with one short spoken line, in character, without actions or narration.\n"
    "Traveller: Is the inn still open?\n"
    "Innkeeper: Aye, come in out of the cold, there's stew on.\n"
    "Traveller: Have you seen anything odd lately?\n"
    "Innkeeper: Only the miller's cat, and he's odd enough for all of us.\n\n"
)

PROMPT_FORMS = ("text", "chat")
"""How a model gets the working memory: as one prompt text, or as chat messages."""

PROMPT_PREFIXES = ("", FEW_SHOT)
"""The fixed texts a backend may put before the working memory: none, or llamacpp's few-shot."""


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """A backend's raw answer, before output handling, with what the call cost (`usage`) and
    which model gave it (`served_by`) as far as the backend can say: the audit keeps both."""

    text: str
    model: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    usage: Usage = Usage()
    served_by: ServedBy = ServedBy()


class Backend(Protocol):
    """What a worker needs of a backend.

    `prompt_form` (one of `PROMPT_FORMS`) says whether the model gets the prompt as text
    or as chat messages; `prompt_prefix` (one of `PROMPT_PREFIXES`) is what it puts before
    it. Together they let the audit record and replay the exact text the model was given.
    """

    name: str
    model: str
    prompt_form: str
    prompt_prefix: str

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None) -> Reply:
        """One raw reply. Raises InferenceError (or a subclass) on failure; never partial text.

        `schema`: the JSON Schema the reply must keep (a structured reply, sim.output), which
        the backend asks its server to enforce the way that server can; None for a line."""
        ...


@runtime_checkable
class Limited(Protocol):
    """A backend that adapts how many requests each of its servers gets at once (`openai`)."""

    def limits(self) -> dict[str, int]:
        """Each server's limit now, by its URL."""
        ...


class Tokenizer(Protocol):
    """Where a server's token counts come from (`sim.inference.backends.tokenize.ServerTokenizer`)."""

    def known(self, text: str) -> int | None:
        """The count of `text` when it is at hand, without asking."""
        ...

    async def fetch(self, texts: Sequence[str]) -> dict[str, int]:
        """The counts of `texts`, asked where they are not at hand."""
        ...


@runtime_checkable
class Tokenizing(Protocol):
    """A backend whose server counts tokens (`openai`: its first server's `/tokenize`), for a
    retry's working memory under `tokenizer = "server"`."""

    def tokenizer(self) -> Tokenizer | None:
        """The server's tokenizer, if it was opened with one."""
        ...


def convert_options(backend: str, options: Mapping[str, Any], kind: type[T]) -> T:
    """Validate a backend's options, naming the backend and the field at fault."""
    try:
        return msgspec.convert(dict(options), kind, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"backend {backend!r} options: {exc}") from exc
