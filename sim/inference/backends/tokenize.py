"""Token budgets counted with the model server's own tokenizer (`tokenizer = "server"`).

`ServerTokenizer` asks llama.cpp's `POST /tokenize` at the server's root (with several
servers, the first one's: the same server in every process of a run), special tokens
neither added nor parsed, as npcsim's other tokenizers count. The working-memory builder
counts synchronously, so this is a synchronous client: its requests go over loopback or a
local network, and each text's count is kept in an LRU of `CACHED_TEXTS` texts, so an
item is asked once however many prompts hold it; each build's exact count of its whole
prompt is one request, and one more for each further item it offers to keep.

The core counts with it once it is installed (`sim.memory.counting_with`): by
`open_tokenizer` for a run's shard, which first checks that the server answers
`/tokenize` (a vLLM or OpenAI server does not), and by every openai backend opened
(`server_counter`), so that a worker in any process builds a retry's working memory
in the same tokens as the shard.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import msgspec

from sim.errors import ConfigError, ServerUnavailableError
from sim.inference.backends._base import convert_options
from sim.inference.backends._reported import server_root
from sim.inference.backends.openai import OpenAIOptions
from sim.inference.backends.servers import each_server, shown_url
from sim.memory import TokenCounter, WorkingMemoryConfig, counting_with, token_counter

__all__ = ["CACHED_TEXTS", "ServerTokenizer", "open_tokenizer", "server_counter"]

CACHED_TEXTS = 8192
"""How many texts' counts a server tokenizer keeps (least recently used out first)."""

SERVER = "server"
_READ_S = 10.0  # seconds to wait for one count: a loopback server answers in milliseconds
_PROBE = "npcsim"


class ServerTokenizer:
    """Counts a text's tokens with one server's `POST /tokenize`; `count` is the cached counter."""

    def __init__(self, options: OpenAIOptions) -> None:
        self.url = f"{server_root(options.base_url)}/tokenize"
        headers: dict[str, str] = {}
        api_key = os.environ.get(options.api_key_env)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(timeout=httpx.Timeout(_READ_S, connect=options.connect_timeout), headers=headers)
        self.count: TokenCounter = functools.lru_cache(maxsize=CACHED_TEXTS)(self._ask)

    def close(self) -> None:
        self._client.close()

    def _ask(self, text: str) -> int:
        """The count of `text`; a ServerUnavailableError when the server cannot answer now, a
        ConfigError when it is no tokenizer."""
        shown = shown_url(self.url)
        try:
            response = self._client.post(self.url, json={"content": text, "add_special": False,
                                                         "parse_special": False})
        except httpx.HTTPError as exc:
            raise ServerUnavailableError(f"tokenizer 'server': POST {shown}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ServerUnavailableError(f"tokenizer 'server': POST {shown} answered {response.status_code}")
        tokens = _tokens(response) if response.status_code == 200 else None
        if tokens is None:
            raise ConfigError(
                f"tokenizer 'server': POST {shown} answered {response.status_code} without a list of tokens: "
                "a llama.cpp server counts tokens there, a vLLM or OpenAI server cannot; "
                "use tokenizer 'gguf:PATH' or 'cl100k'"
            )
        return len(tokens)


def _tokens(response: httpx.Response) -> list[Any] | None:
    try:
        tokens = msgspec.json.decode(response.content)["tokens"]
    except (msgspec.DecodeError, KeyError, TypeError):
        return None
    return tokens if isinstance(tokens, list) else None


@contextmanager
def server_counter(options: Mapping[str, Any]) -> Iterator[ServerTokenizer]:
    """Install the first server's counter as tokenizer "server" while the block runs; it asks
    nothing until a working memory counts with it."""
    tokenizer = ServerTokenizer(convert_options("openai", each_server(options)[0], OpenAIOptions))
    try:
        with counting_with(SERVER, tokenizer.count):
            yield tokenizer
    finally:
        tokenizer.close()


@asynccontextmanager
async def open_tokenizer(config: WorkingMemoryConfig, backend: str, options: Mapping[str, Any]) -> AsyncIterator[None]:
    """Open the tokenizer a run's token budget is counted with, or refuse it in one line.

    "server" needs the openai backend and a first server that answers `/tokenize`; it is
    installed while the block runs. Another tokenizer is loaded now, so that a bad one is
    refused before the run starts. Without a token budget nothing is counted.
    """
    if config.max_context_tokens is None:
        yield
        return
    if config.tokenizer != SERVER:
        await asyncio.to_thread(token_counter, config.tokenizer)
        yield
        return
    if backend != "openai":
        raise ConfigError(
            f"tokenizer 'server' counts with a llama.cpp server's /tokenize, and backend {backend!r} has none: "
            "use --backend openai --base-url URL, or tokenizer 'gguf:PATH' or 'cl100k'"
        )
    with server_counter(options) as tokenizer:
        try:
            await asyncio.to_thread(tokenizer.count, _PROBE)
        except ServerUnavailableError as exc:
            raise ConfigError(str(exc)) from exc
        yield
