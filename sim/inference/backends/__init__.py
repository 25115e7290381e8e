"""Inference backends: `scripted` (default), `openai` (one server or several), `llamacpp` (extra `llm`).

A backend turns a working memory into a raw reply; output handling, deadlines and the
fallback are the worker's business, not the backend's. Each backend validates its own
options and is opened with `async with open_backend(...)`. What every backend is
(`Backend`, `Reply`, the prompt forms and prefixes) lives in `_base`, which the backends
import; this package imports a backend only when it is opened.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import msgspec

from sim.errors import ConfigError
from sim.inference.backends._base import (
    PROMPT_FORMS,
    PROMPT_PREFIXES,
    Backend,
    Limited,
    Reply,
    Tokenizer,
    Tokenizing,
    convert_options,
)
from sim.memory import WorkingMemoryConfig
from sim.output import OutputPolicy, reply_schema, reply_tokens
from sim.wire.attempt import ServedBy

if TYPE_CHECKING:
    from sim.inference.backends.tokenize import ServerTokenizer

__all__ = [
    "BACKENDS", "PROMPT_FORMS", "PROMPT_PREFIXES", "Backend", "Limited", "Reply", "Tokenizer", "Tokenizing",
    "check_context_window", "check_reply_room",
    "convert_options", "open_backend", "open_tokenizer", "served_now",
]

BACKENDS = ("scripted", "openai", "llamacpp")


def check_reply_room(name: str, options: Mapping[str, Any], policies: Iterable[OutputPolicy | None],
                     max_line_chars: int) -> None:
    """A ConfigError, in one line, when the named backend's `structured_max_tokens` cannot hold
    the longest reply the schema of a structured NPC of `policies` lets a model write
    (`sim.output.reply_tokens`): a reply the grammar holds would be cut before it ends."""
    try:
        most = msgspec.convert(options.get("structured_max_tokens"), int | None, strict=False)
    except msgspec.ValidationError:
        return  # the options' own error, when the backend opens
    if most is None or name not in ("openai", "llamacpp"):
        return  # unset: each request asks for its schema's longest reply
    distinct = {msgspec.json.encode(p): p for p in policies if p is not None and p.structured}  # NPCs share them
    longest = max((reply_tokens(reply_schema(p, max_line_chars)) for p in distinct.values()), default=0)
    if most < longest:
        raise ConfigError(
            f"backend {name!r} options: structured_max_tokens {most} cannot hold the longest structured reply, "
            f"{longest} tokens (one a character, within the reply schema's bounds): raise it, or leave it unset"
        )


async def check_context_window(name: str, options: Mapping[str, Any], budget_tokens: int | None) -> None:
    """A ConfigError when the named backend's model cannot hold a working memory of
    `budget_tokens` tokens and its reply; `openai` asks its server (a llama.cpp server says
    its window), the others are not checked."""
    if name == "openai":
        from sim.inference.backends._urls import each_server
        from sim.inference.backends.openai import check_server_window

        for server in each_server(options):
            await check_server_window(server, budget_tokens)


@asynccontextmanager
async def open_tokenizer(
    config: WorkingMemoryConfig, name: str, options: Mapping[str, Any]
) -> AsyncIterator[ServerTokenizer | None]:
    """Open the tokenizer `config`'s token budget is counted with, for the named backend's
    run, or refuse it in one line: `tokenizer = "server"` gives its first server's
    `/tokenize` (`ServerTokenizer`), another tokenizer is loaded and None given."""
    from sim.inference.backends.tokenize import open_tokenizer as open_counting

    async with open_counting(config, name, options) as tokenizer:
        yield tokenizer


async def served_now(name: str, options: Mapping[str, Any]) -> ServedBy:
    """Which model the named backend answers with now, as its replies name it (`audit replay`
    compares it with each record's): `openai` asks its (first) server, `llamacpp` reads its model file."""
    if name == "openai":
        from sim.inference.backends._urls import each_server
        from sim.inference.backends.openai import served_now as server_model

        return await server_model(each_server(options)[0])
    if name == "llamacpp":
        from sim.inference.backends.llamacpp import served_now as file_model

        return await asyncio.to_thread(file_model, options)
    return ServedBy()


@asynccontextmanager
async def open_backend(
    name: str, options: Mapping[str, Any], concurrency: int, time_limit: float | None = None
) -> AsyncIterator[Backend]:
    """Open the named backend; `concurrency` is the worker's slot count (a default for N in flight).

    `openai` carries its first server's tokenizer (`Tokenizing`), so that a worker builds a
    retry's working memory in the same tokens as the shard.
    `time_limit` is the worker's bound on one inference: a backend's own timeouts fit in it.
    """
    if name == "scripted":
        from sim.inference.backends.scripted import ScriptedBackend

        yield ScriptedBackend(options)
    elif name == "openai":
        from sim.inference.backends.servers import open_servers
        from sim.inference.backends.tokenize import open_server_tokenizer

        async with (
            open_server_tokenizer(options) as tokenizer,
            open_servers(options, concurrency, time_limit, tokenizer=tokenizer) as backend,
        ):
            yield backend
    elif name == "llamacpp":
        from sim.inference.backends.llamacpp import open_llamacpp

        async with open_llamacpp(options) as llama:
            yield llama
    else:
        raise ConfigError(f"backend: unknown backend {name!r}; known: {', '.join(BACKENDS)}")
