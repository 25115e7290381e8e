"""The `openai` backend over one or several OpenAI-compatible servers (`base_url`: a URL or a list).

Each NPC's requests go to the first server of its rendezvous order (`spread`), so its
prompts meet that server's cache; when that server is down (it did not answer after its
retries, or its circuit breaker is open) the request goes on to the next server in the same
order. Each server has its own client, retries and circuit breaker (`OpenAIBackend`), and its
own adaptive limit on requests in flight (`AdaptiveLimit`, at most the worker's concurrency).
Each reply names the server that gave it (`ServedBy.server`, without any user and password).
With `slot_affinity` (llama.cpp's server), each NPC's requests also go to its own slot of that
server (`id_slot`, among the slots its `GET /props` says it has: one of its own while there
are slots to spare, `SlotTable`), so that its prompt stays in that slot's cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import msgspec

from sim.errors import BackendTimeoutError, CircuitOpenError, ServerUnavailableError
from sim.inference.backends._base import Reply, Tokenizer, convert_options
from sim.inference.backends._reported import server_slots
from sim.inference.backends._urls import each_server, shown_url
from sim.inference.backends.openai import OpenAIBackend, OpenAIOptions, open_openai
from sim.inference.backends.spread import AdaptiveLimit, SlotTable, rendezvous_order
from sim.inference.backends.tokenize import ServerTokenizer
from sim.memory import WorkingMemory

__all__ = ["Server", "ServersBackend", "each_server", "open_servers", "shown_url"]

log = logging.getLogger(__name__)

_FAILOVER = (ServerUnavailableError, BackendTimeoutError, CircuitOpenError)
"""What a server's failure to answer is; any other error is the request's own, on every server."""


class Server:
    """One server: its backend, its adaptive limit, and the requests it has in flight."""

    def __init__(self, backend: OpenAIBackend, limit: AdaptiveLimit, url: str, slots: int | None = None,
                 keeping: ServerTokenizer | None = None) -> None:
        self.backend = backend
        self.limit = limit
        self.url = url
        self.slots = SlotTable(slots) if slots else None  # each NPC's own slot
        self.keeping = keeping  # counts what never changes, for llama.cpp's `n_keep`
        self.in_flight = 0
        self._turn = asyncio.Condition()

    @property
    def down(self) -> bool:
        """Its circuit breaker is open: skipped while another server may answer."""
        return self.backend.breaker.state == "open"

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None) -> Reply:
        async with self._turn:
            await self._turn.wait_for(lambda: self.in_flight < self.limit.limit)
            self.in_flight += 1
        started, overloads = self.limit.start(), self.backend.overloads
        slot = self.slots.slot(memory.agent_id) if self.slots is not None else None
        try:
            keep = await self._keep(memory)
            reply = await self.backend.generate(memory, schema, slot=slot, keep=keep)
        finally:
            if self.backend.overloads > overloads:
                self.limit.overloaded(started)
            async with self._turn:
                self.in_flight -= 1
                self._turn.notify_all()
        served_ms = reply.usage.served_ms
        self.limit.answered(started, None if served_ms is None else served_ms / 1000)
        return msgspec.structs.replace(reply, served_by=msgspec.structs.replace(reply.served_by, server=self.url))


    async def _keep(self, memory: WorkingMemory) -> int | None:
        """The tokens of the part of the prompt that never changes (the system prompt and the
        canonical facts), which a llama.cpp slot keeps when it shifts its context; None
        without a slot of the NPC's own."""
        if self.keeping is None:
            return None
        fixed = memory.prompt[: memory.system_chars]
        return (await self.keeping.fetch([fixed]))[fixed]


class ServersBackend:
    """The `openai` backend over `servers`, each NPC's requests on its own server first;
    `tokenizer()` is the first server's (`Tokenizing`)."""

    name = "openai"

    def __init__(self, servers: Sequence[Server], tokenizer: Tokenizer | None = None) -> None:
        self.servers = {server.url: server for server in servers}
        self._tokenizer = tokenizer
        first = servers[0].backend
        self.model, self.prompt_form, self.prompt_prefix = first.model, first.prompt_form, first.prompt_prefix

    def order(self, agent_id: str) -> list[Server]:
        """The servers in `agent_id`'s order, those with an open breaker last."""
        ranked = [self.servers[url] for url in rendezvous_order(agent_id, list(self.servers))]
        return [s for s in ranked if not s.down] + [s for s in ranked if s.down]

    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer

    def limits(self) -> dict[str, int]:
        """Each server's adaptive limit now."""
        return {url: server.limit.limit for url, server in self.servers.items()}

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None) -> Reply:
        order = self.order(memory.agent_id)
        for number, server in enumerate(order, 1):
            try:
                return await server.generate(memory, schema)
            except _FAILOVER as exc:
                if number == len(order):
                    raise
                log.info("%s did not answer (%s): %s goes on to %s", server.url, type(exc).__name__,
                         memory.agent_id, order[number].url)
        raise AssertionError("unreachable: the last server returns or raises")


@asynccontextmanager
async def open_servers(
    options: Mapping[str, Any], concurrency: int, time_limit: float | None = None, *,
    clock: Callable[[], float] = time.monotonic, tokenizer: Tokenizer | None = None,
) -> AsyncIterator[ServersBackend]:
    """Open a client for each server of `options["base_url"]`; all are closed however the block ends.

    `concurrency` bounds each server's adaptive limit; `clock` is the breakers' and the limits'.
    `tokenizer` is the first server's, which the backend carries (`Tokenizing`).
    """
    async with AsyncExitStack() as stack:
        servers = []
        for one in each_server(options):
            backend = await stack.enter_async_context(open_openai(one, concurrency, time_limit, clock=clock))
            opts = convert_options("openai", one, OpenAIOptions)
            slots = await server_slots(opts.base_url, opts.connect_timeout) if opts.slot_affinity else None
            if opts.slot_affinity and slots is None:
                log.warning("%s does not say its slots (GET /props total_slots): its NPCs share them",
                            shown_url(opts.base_url))
            limit = AdaptiveLimit(opts.in_flight or concurrency, clock=clock)
            keeping = None
            if slots is not None and opts.endpoint == "completions":  # a chat prompt's template is the server's
                keeping = _tokenizer_of(opts, tokenizer)
                if keeping is not tokenizer:
                    stack.push_async_callback(keeping.aclose)
            servers.append(Server(backend, limit, shown_url(opts.base_url), slots, keeping))
        yield ServersBackend(servers, tokenizer)


def _tokenizer_of(options: OpenAIOptions, given: Tokenizer | None) -> ServerTokenizer:
    """The server's `/tokenize`: the budget's own (`tokenizer = "server"`, the first server's)
    when it is this server's, so that a text is counted once; else one of its own."""
    if isinstance(given, ServerTokenizer) and given.url == ServerTokenizer.url_of(options):
        return given
    return ServerTokenizer(options)
