"""The `openai` backend: any OpenAI-compatible server (vLLM, llama.cpp's server, Ollama).

One `httpx.AsyncClient` per backend, N requests in flight at most. A transient failure
(timeout, connection error, 429, 5xx) is retried with npcsim's one backoff (`sim.backoff`,
its policy from the options `backoff_base` and `backoff_max`); a 429's Retry-After wins
over it. A circuit breaker counts consecutive failures: once open it fails
fast, and after a cooldown it lets one probe through; the probe's outcome closes or reopens
it. The caller bounds the whole call with its own timeout scope.

A reply is read as a stream and at most `reply_bound(max_tokens)` bytes of it: a server
that ignores `max_tokens` (or answers 50 MB for any other reason) costs that much memory,
not the size of its answer. A body over the bound is an `InferenceError` (counted as a
backend error; the fallback line speaks), neither cut nor retried. The client asks for an
uncompressed body, so the bound is on what the server sends.

What a call cost and which model answered go into the audit as the server says them
(`sim.audit.Usage`, `ServedBy`): llama.cpp's `timings` (`prompt_n` evaluated, `cache_n`
reused from its cache, `prompt_ms`, `predicted_ms`), else `usage.prompt_tokens` and
`usage.prompt_tokens_details.cached_tokens` (vLLM, OpenAI); the reply's `model` and
`system_fingerprint`. A field that is missing or not a count is None, never guessed.

`check_server_window` asks a llama.cpp server for the context window of one slot, so that a
run refuses a token budget that cannot fit before it starts.

Timeouts: `connect_timeout` for opening a connection, `read_timeout` for waiting on the
server. The read timeout must be shorter than the caller's time limit (the pool's
inference timeout): a server that hangs then ends in our own counted timeout, which feeds
the circuit breaker, instead of in the caller's cancellation. Unset, it is half the time
limit, at most 30 s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import httpx
import msgspec

from sim.backoff import Backoff, BackoffPolicy
from sim.errors import BackendTimeoutError, CircuitOpenError, ConfigError, InferenceError, ServerUnavailableError
from sim.inference.backends._base import Reply, convert_options
from sim.inference.backends._reported import model_now, reported_usage, served_by, server_window
from sim.memory import WorkingMemory
from sim.output import reply_tokens
from sim.wire.attempt import ServedBy

__all__ = [
    "CircuitBreaker", "OpenAIBackend", "OpenAIOptions", "check_server_window", "open_openai", "reply_bound",
    "served_now",
]

log = logging.getLogger(__name__)

_DEFAULT_READ = 30.0  # seconds: the read timeout when neither the option nor a time limit says less
_ENVELOPE_BYTES = 64 * 1024  # the JSON around the text: ids, usage, a server's extra fields
_BYTES_PER_TOKEN = 256  # a long token, every character JSON-escaped (\uXXXX), with room to spare


def reply_bound(max_tokens: int) -> int:
    """The most bytes of a response body read for a request of `max_tokens` tokens."""
    return _ENVELOPE_BYTES + _BYTES_PER_TOKEN * max(max_tokens, 0)


_PENALTIES = ("frequency_penalty", "presence_penalty", "repeat_penalty", "dry_multiplier")


def _most_tokens(options: OpenAIOptions, schema: Mapping[str, Any] | None) -> int:
    """A request's max_tokens: a line's `max_tokens`, a structured reply's `structured_max_tokens`,
    else the most its schema's longest reply takes (so a reply the grammar holds always ends)."""
    if schema is None:
        return options.max_tokens
    return options.structured_max_tokens or reply_tokens(schema)


class OpenAIOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    base_url: str
    model: str = "default"
    endpoint: Literal["chat", "completions"] = "chat"
    api_key_env: str = "OPENAI_API_KEY"
    max_tokens: int = 64
    temperature: float = 0.7
    stop: tuple[str, ...] = ("\n",)
    in_flight: int | None = None
    connect_timeout: float = 5.0
    read_timeout: float | None = None  # None: derived from the caller's time limit
    retries: int = 2
    backoff_base: float = 0.2
    backoff_max: float = 5.0
    max_retry_after: float = 30.0
    breaker_failures: int = 5
    breaker_cooldown: float = 10.0
    slot_affinity: bool = False  # llama.cpp: each NPC's requests in its own slot (`id_slot`; servers.py)
    # llama.cpp: reuse cached chunks of at least this many tokens past the common prefix (`n_cache_reuse`)
    cache_reuse: Annotated[int, msgspec.Meta(ge=0)] = 0
    # A structured reply's tokens at most; None: its schema's longest reply (`sim.output.reply_tokens`)
    structured_max_tokens: Annotated[int, msgspec.Meta(gt=0)] | None = None
    # Sampling against loops, sent only when set: OpenAI's penalties, then llama.cpp's (its server's names)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repeat_penalty: float | None = None
    dry_multiplier: float | None = None

    @property
    def backoff(self) -> BackoffPolicy:
        """The waits between retries: `backoff_base` is the first one's cap, `backoff_max` the largest."""
        return BackoffPolicy(initial=self.backoff_base, maximum=self.backoff_max)


class _Transient(InferenceError):
    """A failure worth retrying; `wait` is the server's Retry-After, when it gave one."""

    def __init__(
        self, message: str, wait: float | None = None, counts_for_breaker: bool = True, overload: bool = False,
    ) -> None:
        super().__init__(message)
        self.wait = wait
        self.counts_for_breaker = counts_for_breaker
        self.overload = overload  # 429 or 503: the server said it is too busy


class CircuitBreaker:
    """Closed, open (fail fast) or half-open (one probe in flight); the clock is injectable."""

    def __init__(self, failures: int, cooldown: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self._clock = clock
        self._consecutive = 0
        self._opened_at: float | None = None
        self._probing = False
        self.opened = 0

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._probing or self._clock() - self._opened_at < self.cooldown:
            return "open"
        return "half-open"

    def before(self, what: str) -> None:
        """Raise CircuitOpenError while open; in half-open, let exactly one probe through."""
        state = self.state
        if state == "open":
            raise CircuitOpenError(f"{what}: circuit open after {self._consecutive} consecutive failures")
        if state == "half-open":
            self._probing = True

    def success(self) -> None:
        if self._opened_at is not None:
            log.info("circuit closed again after a successful probe")
        self._consecutive = 0
        self._opened_at = None
        self._probing = False

    def abandon(self) -> None:
        """A call was cancelled: a probe that never finished counts as a failed one."""
        if self._probing:
            self.failure()

    def failure(self) -> None:
        self._consecutive += 1
        if self._probing or (self._opened_at is None and self._consecutive >= self.failures):
            if self._opened_at is None:
                log.warning("circuit opened after %d consecutive failures", self._consecutive)
            self.opened += 1
            self._opened_at = self._clock()
            self._probing = False


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


class OpenAIBackend:
    name = "openai"

    def __init__(
        self, options: OpenAIOptions, client: httpx.AsyncClient, in_flight: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = options
        self._client = client
        self._slots = asyncio.Semaphore(in_flight)
        self.model = options.model
        self.breaker = CircuitBreaker(options.breaker_failures, options.breaker_cooldown, clock)
        self.overloads = 0  # 429s and 503s seen: the adaptive limit's signal (sim.inference.backends.servers)
        self._params: dict[str, Any] = {
            "endpoint": options.endpoint,
            "max_tokens": options.max_tokens,
            "temperature": options.temperature,
            "stop": list(options.stop),
        }
        if options.cache_reuse:
            self._params["cache_reuse"] = options.cache_reuse
        self._sampling = {name: getattr(options, name) for name in _PENALTIES if getattr(options, name) is not None}
        self._params.update(self._sampling)
        self._path = "/chat/completions" if options.endpoint == "chat" else "/completions"
        self.prompt_form = "chat" if options.endpoint == "chat" else "text"
        self.prompt_prefix = ""

    def _body(self, memory: WorkingMemory, schema: Mapping[str, Any] | None) -> dict[str, Any]:
        """The request; a `schema` is `response_format` on the chat endpoint, llama-server's
        `json_schema` on completions. A request with a schema has no stop sequences: the schema
        ends the reply where its object ends, and the server's grammar lets a newline stand
        between its fields, where the line's stop ("\n") would cut the object at its first."""
        o = self._options
        body: dict[str, Any] = {"model": o.model, "max_tokens": _most_tokens(o, schema), "temperature": o.temperature,
                                **self._sampling}
        if o.stop and schema is None:
            body["stop"] = list(o.stop)
        if o.cache_reuse:
            body["n_cache_reuse"] = o.cache_reuse
        if o.endpoint == "chat":
            body["messages"] = memory.messages()
        else:
            body["prompt"] = memory.prompt
        if schema is not None and o.endpoint == "chat":
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "npc_reply", "schema": schema}}
        elif schema is not None:
            body["json_schema"] = schema
        return body

    async def generate(
        self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None, *, slot: int | None = None,
        keep: int | None = None,
    ) -> Reply:
        """`slot`: llama.cpp's `id_slot` (None: any); `keep`: its `n_keep`, what the slot keeps on a shift."""
        body = self._body(memory, schema)
        params = self._params if schema is None else {**self._params, "stop": [], "max_tokens": body["max_tokens"]}
        body.update({name: n for name, n in (("id_slot", slot), ("n_keep", keep)) if n is not None})
        url = f"{self._options.base_url.rstrip('/')}{self._path}"
        backoff = Backoff(self._options.backoff)
        async with self._slots:
            for attempt in range(self._options.retries + 1):
                self.breaker.before(url)
                try:
                    reply = await self._post(url, body, params)
                except asyncio.CancelledError:
                    self.breaker.abandon()
                    raise
                except _Transient as exc:
                    self.overloads += exc.overload
                    if exc.counts_for_breaker:
                        self.breaker.failure()
                    else:
                        self.breaker.success()
                    if attempt == self._options.retries:
                        if isinstance(exc.__cause__, httpx.TimeoutException):
                            raise BackendTimeoutError(str(exc)) from exc
                        raise ServerUnavailableError(str(exc)) from exc
                    wait = backoff.next()  # counted on every retry, so the waits grow by attempt
                    if exc.wait is not None:
                        wait = min(exc.wait, self._options.max_retry_after)  # the server's Retry-After wins
                    log.debug("retrying %s in %.2fs: %s", url, wait, exc)
                    await asyncio.sleep(wait)
                    continue
                except InferenceError:
                    self.breaker.success()  # the server answered; the answer was unusable
                    raise
                self.breaker.success()
                return reply
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _post(self, url: str, body: dict[str, Any], params: dict[str, Any]) -> Reply:
        try:
            async with self._client.stream("POST", url, json=body) as response:
                status = response.status_code
                if status == 429:
                    raise _Transient(f"POST {url}: 429 Too Many Requests", _retry_after(response),
                                     counts_for_breaker=False, overload=True)
                if status >= 500:
                    raise _Transient(f"POST {url}: server error {status}", overload=status == 503)
                content = await self._read(url, response, body["max_tokens"])
        except httpx.TimeoutException as exc:
            raise _Transient(f"POST {url}: timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Transient(f"POST {url}: {type(exc).__name__}: {exc}") from exc
        except httpx.DecodingError as exc:
            raise InferenceError(f"POST {url}: the body cannot be decoded: {exc}") from exc
        if status >= 400:
            raise InferenceError(f"POST {url}: {status} {content[:200]!r}")
        return self._parse(url, content, params)

    async def _read(self, url: str, response: httpx.Response, max_tokens: int) -> bytes:
        """The body, or an InferenceError as soon as it is known to pass the bound."""
        bound = reply_bound(max_tokens)
        over = f"POST {url}: a reply over {bound} bytes (the bound for max_tokens={max_tokens})"
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > bound:
            raise InferenceError(f"{over}: Content-Length {declared}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > bound:
                raise InferenceError(over)
            chunks.append(chunk)
        return b"".join(chunks)

    def _parse(self, url: str, content: bytes, params: dict[str, Any]) -> Reply:
        """The reply's text, what the server said it cost, and which model it named."""
        try:
            data = msgspec.json.decode(content)
            choice = data["choices"][0]
            text = choice["message"]["content"] if self._options.endpoint == "chat" else choice["text"]
            if not isinstance(text, str):
                raise TypeError(f"text is {type(text).__name__}")
        except (msgspec.DecodeError, KeyError, IndexError, TypeError) as exc:
            raise InferenceError(f"POST {url}: malformed response ({exc}): {content[:200]!r}") from exc
        return Reply(text=text, model=self.model, params=params, usage=reported_usage(data),
                     served_by=served_by(data))


def _timeouts(opts: OpenAIOptions, time_limit: float | None) -> httpx.Timeout:
    """connect and read timeouts; the read timeout stays below the caller's time limit."""
    for name in ("connect_timeout", "read_timeout"):
        value = getattr(opts, name)
        if value is not None and not value > 0:
            raise ConfigError(f"backend 'openai' options: {name} must be a number > 0, got {value!r}")
    read = opts.read_timeout
    if read is None:
        read = _DEFAULT_READ if time_limit is None else min(_DEFAULT_READ, time_limit / 2)
    elif time_limit is not None and read >= time_limit:
        raise ConfigError(
            f"backend 'openai' options: read_timeout {read!r} must be below the inference timeout {time_limit!r}, "
            "so that a hanging server counts as a backend failure"
        )
    return httpx.Timeout(read, connect=min(opts.connect_timeout, read))


async def check_server_window(options: Mapping[str, Any], budget_tokens: int | None) -> None:
    """A ConfigError when a working memory of `budget_tokens` and a reply of `max_tokens`
    cannot fit in one of the server's slots; nothing to check without a token budget, or
    when the server does not say its window (a llama.cpp server does: `GET /props`).

    The budget is counted with npcsim's token counter and the window with the model's
    tokenizer: the check is of the configuration, not of each prompt."""
    if budget_tokens is None:
        return
    opts = convert_options("openai", options, OpenAIOptions)
    window = await server_window(opts.base_url, opts.connect_timeout)
    if window is None:
        log.info("%s does not say its context window (GET /props, /slots): the token budget is not checked "
                 "against it", opts.base_url)
        return
    if budget_tokens + opts.max_tokens > window:
        raise ConfigError(
            f"max_context_tokens {budget_tokens} + max_tokens {opts.max_tokens} = {budget_tokens + opts.max_tokens} "
            f"tokens cannot fit the server's context window of {window} tokens per slot ({opts.base_url})"
        )


async def served_now(options: Mapping[str, Any]) -> ServedBy:
    """The model the server serves now, as its replies would name it (a ConfigError when it cannot be asked)."""
    opts = convert_options("openai", options, OpenAIOptions)
    return await model_now(opts.base_url, opts.connect_timeout)


@asynccontextmanager
async def open_openai(
    options: Mapping[str, Any], concurrency: int, time_limit: float | None = None, *,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[OpenAIBackend]:
    """Open the HTTP client; it is closed however the block ends.

    `time_limit` is the caller's bound on one inference (seconds), when it has one;
    `clock` is the circuit breaker's (a virtual one in tests).
    """
    opts = convert_options("openai", options, OpenAIOptions)
    if not opts.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"backend 'openai' options: base_url must be http(s)://..., got {opts.base_url!r}")
    in_flight = opts.in_flight or concurrency
    if in_flight <= 0 or opts.retries < 0 or opts.breaker_failures <= 0:
        raise ConfigError(
            f"backend 'openai' options: in_flight, breaker_failures must be > 0 and retries >= 0, got "
            f"in_flight={in_flight}, breaker_failures={opts.breaker_failures}, retries={opts.retries}"
        )
    headers = {"Accept-Encoding": "identity"}  # the bound is on what the server sends (see above)
    api_key = os.environ.get(opts.api_key_env)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    timeout = _timeouts(opts, time_limit)
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(
        base_url=opts.base_url.rstrip("/"), headers=headers, timeout=timeout, limits=limits
    ) as client:
        yield OpenAIBackend(opts, client, in_flight, clock)
