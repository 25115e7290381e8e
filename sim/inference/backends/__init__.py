"""Inference backends: `scripted` (default), `openai`, `llamacpp` (extra `llm`).

A backend turns a working memory into a raw reply; output handling, deadlines and the
fallback are the worker's business, not the backend's. Each backend validates its own
options and is opened with `async with open_backend(...)`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

import msgspec

from sim.errors import ConfigError
from sim.inference._types import Reply
from sim.memory import WorkingMemory

__all__ = ["BACKENDS", "Backend", "convert_options", "open_backend"]

BACKENDS = ("scripted", "openai", "llamacpp")

T = TypeVar("T")


class Backend(Protocol):
    """What a worker needs of a backend.

    A backend sends the working memory as `sim.memory` rendered it and adds nothing to it
    but a fixed `prompt_prefix`; `prompt_form` says whether the model gets the prompt as
    text ("text") or as chat messages ("chat"). Together they let the audit record and
    replay the exact text the model was given.
    """

    name: str
    model: str
    prompt_form: str
    prompt_prefix: str

    async def generate(self, memory: WorkingMemory) -> Reply:
        """One raw reply. Raises InferenceError (or a subclass) on failure; never partial text."""
        ...


def convert_options(backend: str, options: Mapping[str, Any], kind: type[T]) -> T:
    """Validate a backend's options, naming the backend and the field at fault."""
    try:
        return msgspec.convert(dict(options), kind, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"backend {backend!r} options: {exc}") from exc


@asynccontextmanager
async def open_backend(
    name: str, options: Mapping[str, Any], concurrency: int, time_limit: float | None = None
) -> AsyncIterator[Backend]:
    """Open the named backend; `concurrency` is the worker's slot count (a default for N in flight).

    `time_limit` is the worker's bound on one inference: a backend's own timeouts fit in it.
    """
    if name == "scripted":
        from sim.inference.backends.scripted import ScriptedBackend

        yield ScriptedBackend(options)
    elif name == "openai":
        from sim.inference.backends.openai import open_openai

        async with open_openai(options, concurrency, time_limit) as backend:
            yield backend
    elif name == "llamacpp":
        from sim.inference.backends.llamacpp import open_llamacpp

        async with open_llamacpp(options) as llama:
            yield llama
    else:
        raise ConfigError(f"backend: unknown backend {name!r}; known: {', '.join(BACKENDS)}")
