"""Token budgets counted with the model server's own tokenizer (`tokenizer = "server"`).

`ServerTokenizer` asks llama.cpp's `POST /tokenize` at the server's root (with several
servers, the first one's: the same server in every process of a run), special tokens
neither added nor parsed, as npcsim's other tokenizers count. It is asynchronous and is
asked only between builds, never from inside one (`sim.inference._counted`): it fetches
the texts a build named (concurrently, `FETCHED_AT_ONCE` at a time), and keeps each
text's count in an LRU of `CACHED_TEXTS` texts, so an item is asked once however many
prompts hold it.

A run's shard opens it with `open_tokenizer`, which first checks that the server answers
`/tokenize` (a vLLM or OpenAI server does not); an openai backend opens its own
(`open_server_tokenizer`), with which a worker builds a retry's working memory in the same
tokens as the shard.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec

from sim.errors import ConfigError, ServerUnavailableError
from sim.inference.backends._base import convert_options
from sim.inference.backends._reported import server_root
from sim.inference.backends._urls import each_server, shown_url
from sim.inference.backends.openai import OpenAIOptions
from sim.memory import WorkingMemoryConfig, counted_by_server, token_counter

__all__ = ["CACHED_TEXTS", "FETCHED_AT_ONCE", "ServerTokenizer", "open_server_tokenizer", "open_tokenizer"]

CACHED_TEXTS = 8192
"""How many texts' counts a server tokenizer keeps (least recently used out first)."""

FETCHED_AT_ONCE = 16
"""How many texts a server tokenizer asks for at the same time."""

_READ_S = 10.0  # seconds to wait for one count: a loopback server answers in milliseconds
_PROBE = "npcsim"


class ServerTokenizer:
    """Counts texts' tokens with one server's `POST /tokenize`; `fetch` asks, `counts` keeps."""

    def __init__(self, options: OpenAIOptions) -> None:
        self.url = self.url_of(options)
        headers: dict[str, str] = {}
        api_key = os.environ.get(options.api_key_env)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(_READ_S, connect=options.connect_timeout),
                                         headers=headers)
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._at_once = asyncio.Semaphore(FETCHED_AT_ONCE)

    @staticmethod
    def url_of(options: OpenAIOptions) -> str:
        """The `/tokenize` of the server `options` name."""
        return f"{server_root(options.base_url)}/tokenize"

    async def aclose(self) -> None:
        await self._client.aclose()

    def known(self, text: str) -> int | None:
        """The count of `text` when it was fetched and is still kept."""
        count = self._cache.get(text)
        if count is not None:
            self._cache.move_to_end(text)
        return count

    async def fetch(self, texts: Sequence[str]) -> dict[str, int]:
        """The counts of `texts`, asked of the server for those not kept."""
        wanted = list(dict.fromkeys(texts))
        asked = [text for text in wanted if self.known(text) is None]
        got = dict(zip(asked, await asyncio.gather(*(self._ask(text) for text in asked)), strict=True))
        for text, count in got.items():
            self._cache[text] = count
            self._cache.move_to_end(text)
        while len(self._cache) > CACHED_TEXTS:
            self._cache.popitem(last=False)
        return {text: got[text] if text in got else self._cache[text] for text in wanted}

    async def _ask(self, text: str) -> int:
        """The count of `text`; a ServerUnavailableError when the server cannot answer now, a
        ConfigError when it is no tokenizer."""
        shown = shown_url(self.url)
        try:
            async with self._at_once:
                response = await self._client.post(self.url, json={"content": text, "add_special": False,
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


@asynccontextmanager
async def open_server_tokenizer(options: Mapping[str, Any]) -> AsyncIterator[ServerTokenizer]:
    """The first server's tokenizer, closed when the block ends; it asks nothing until a
    build needs counts."""
    tokenizer = ServerTokenizer(convert_options("openai", each_server(options)[0], OpenAIOptions))
    try:
        yield tokenizer
    finally:
        await tokenizer.aclose()


@asynccontextmanager
async def open_tokenizer(
    config: WorkingMemoryConfig, backend: str, options: Mapping[str, Any]
) -> AsyncIterator[ServerTokenizer | None]:
    """Open the tokenizer a run's token budget is counted with, or refuse it in one line.

    "server" needs the openai backend and a first server that answers `/tokenize`; its
    tokenizer is given while the block runs. Another tokenizer is loaded now, so that a bad
    one is refused before the run starts, and None is given. Without a token budget nothing
    is counted.
    """
    if not counted_by_server(config):
        if config.max_context_tokens is not None:
            await asyncio.to_thread(token_counter, config.tokenizer)
        yield None
        return
    if backend != "openai":
        raise ConfigError(
            f"tokenizer 'server' counts with a llama.cpp server's /tokenize, and backend {backend!r} has none: "
            "use --backend openai --base-url URL, or tokenizer 'gguf:PATH' or 'cl100k'"
        )
    async with open_server_tokenizer(options) as tokenizer:
        try:
            await tokenizer.fetch([_PROBE])
        except ServerUnavailableError as exc:
            raise ConfigError(str(exc)) from exc
        yield tokenizer
