"""Serving one request: what a worker does, in-process or remote.

Drop it when stale, call the backend within the time left, keep a bounded excerpt of the
raw output (`raw_excerpt`), clean and judge it, retry once with a prohibition when the
output is rejected (a working memory rebuilt with the prohibition inside the budget), and
answer with the fallback line whenever anything fails: `serve` never raises for a backend
failure. Every call is kept as an `Attempt`. Under an NPC's output policy the backend is
asked for a structured reply (`reply_schema`, its NPC's) and each attempt is judged, and its proposals
gated, by `judge_reply` (sim.output); the attempt keeps every verdict.
A backend with adaptive limits (`Limited`) gives them to each result, the way its pool hears
of them whatever the transport.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

import msgspec

from sim.audit import Attempt
from sim.errors import BackendTimeoutError, CircuitOpenError, InferenceError, OverBudgetError, RejectedOutputError
from sim.inference._counted import counted_memory
from sim.inference._counters import Counters, LogOnce
from sim.inference._dispatch import fallback_result
from sim.inference.backends import Backend, Limited, Tokenizer, Tokenizing
from sim.memory import WorkingMemory
from sim.output import FactGuard, Rules, Verdict, judge_reply, reply_schema
from sim.wire.inference import InferenceRequest, InferenceResult

__all__ = ["RAW_EXCERPT_CHARS", "retry_memory", "serve"]

log = logging.getLogger(__name__)

RAW_EXCERPT_CHARS = 8_192


def raw_excerpt(text: str) -> str:
    """`text` when it is at most RAW_EXCERPT_CHARS long, else its start and a marker with its size.

    The raw reply goes into the result and the audit once per attempt: a huge reply must not
    cost a store its size per attempt. Output handling judges the excerpt too, so the line,
    the verdict and the record agree. The marker is a bracketed line of its own, a stage
    direction output handling never says.
    """
    if len(text) <= RAW_EXCERPT_CHARS:
        return text
    return f"{text[:RAW_EXCERPT_CHARS]}\n[reply cut: {RAW_EXCERPT_CHARS} of {len(text)} characters kept]"


async def retry_memory(
    request: InferenceRequest, memory: WorkingMemory, verdict: Verdict, tokenizer: Tokenizer | None
) -> tuple[WorkingMemory, dict[str, int]] | None:
    """The working memory of the one retry after a rejected reply and the server's token
    counts it was cut with, or None when there is none.

    It is built by `sim.memory` from the request's state with the prohibition as mandatory
    content inside the same budget: flexible items make room for it; under `tokenizer =
    "server"` its counts are fetched from `tokenizer` before the build. When the rule does
    not fit even then, there is no retry (the fallback speaks), so a retry never goes over a
    budget the first attempt kept.
    """
    if memory.prohibition is not None or verdict.prohibition is None:
        return None  # a retry was made already
    if request.state is None or request.config is None:
        return None
    try:
        retry, counts = await counted_memory(
            request.state, memory.player_input, request.config, tokenizer, prohibition=verdict.prohibition
        )
    except OverBudgetError:
        return None  # policy "raise"
    if retry.report.over_budget and not memory.report.over_budget:
        log.info("no retry for %s: the rule does not fit the budget", request.agent_id)
        return None
    return retry, counts


@functools.cache
def _tokenizing(kind: type) -> bool:
    """Whether backends of `kind` carry a server's tokenizer: asked once per type."""
    return issubclass(kind, Tokenizing)


def _tokenizer(backend: Backend) -> Tokenizer | None:
    return backend.tokenizer() if _tokenizing(type(backend)) and isinstance(backend, Tokenizing) else None


@functools.cache
def _limited(kind: type) -> bool:
    """Whether backends of `kind` have adaptive limits: asked once per type, not per request."""
    return issubclass(kind, Limited)


def _watch_limits(counters: Counters, backend: Backend) -> None:
    """The counters read the backend's limits from now on, when it has some."""
    if counters.served_limits is None and _limited(type(backend)) and isinstance(backend, Limited):
        counters.served_limits = backend.limits  # the cached test first: isinstance is slow here


def _attempt(backend: Backend, memory: WorkingMemory) -> Attempt:
    """The attempt about to be made: exactly the text the backend will give the model."""
    return Attempt(
        prompt=backend.prompt_prefix + memory.sent_text(backend.prompt_form),
        prohibition=memory.prohibition,
        form=backend.prompt_form,
        prefix=backend.prompt_prefix,
    )


async def serve(
    request: InferenceRequest,
    backend: Backend,
    *,
    time_limit: float,
    rules: Rules,
    counters: Counters,
    worker: str = "",
    clock: Callable[[], float] = time.time,
    warn: LogOnce | None = None,
    guard: FactGuard | None = None,
) -> InferenceResult:
    """Answer one request; a fallback result whenever the backend cannot give a usable line.

    `time_limit` (seconds) bounds the backend's time together with the request's deadline;
    it is a parameter, not the caller's timeout scope, because the fallback must still be
    produced when it runs out. Every call to the backend is kept as an `Attempt`, its reply
    judged under `rules` with the request's output policy; `guard` is a fact guard handed
    in instead of the one the rules name.
    """
    started = time.perf_counter()
    warn = warn or LogOnce(log)
    _watch_limits(counters, backend)
    left = request.deadline - clock()
    if left <= 0:
        counters.dropped_stale += 1
        log.debug("dropped stale request %s of %s (%.3fs past its deadline)", request.id, request.agent_id, -left)
        return fallback_result(request, "stale", backend=backend.name, model=backend.model, worker=worker)
    limit = min(time_limit, left)
    policy = request.output
    rules = msgspec.structs.replace(rules, output=policy)
    schema = reply_schema(policy, rules.max_line_chars) if policy is not None and policy.structured else None
    attempts: list[Attempt] = []
    counts: dict[str, int] = {}
    in_flight: Attempt | None = None
    raw: str | None = None
    reason: str
    detail: str
    try:
        async with asyncio.timeout(limit):
            memory: WorkingMemory | None = request.memory
            while memory is not None:
                in_flight = _attempt(backend, memory)
                reply = await backend.generate(memory, schema)
                raw = raw_excerpt(reply.text)
                verdict = judge_reply(raw, memory, rules, guard)
                attempts.append(msgspec.structs.replace(in_flight, raw_response=raw, problem=verdict.problem,
                                                        proposals=verdict.proposals, usage=reply.usage,
                                                        served_by=reply.served_by))
                in_flight = None
                if verdict.problem is None:
                    return InferenceResult(
                        id=request.id,
                        agent_id=request.agent_id,
                        tick=request.tick,
                        line=verdict.line,
                        raw_response=raw,
                        backend=backend.name,
                        model=reply.model,
                        params=reply.params,
                        timings={"backend_ms": (time.perf_counter() - started) * 1000},
                        tokens=reply.usage.completion_tokens,
                        worker=worker,
                        attempts=tuple(attempts),
                        prompt_tokens=reply.usage.prompt_tokens,
                        counts=counts,
                    )
                counters.rejected_outputs += 1
                retry = await retry_memory(request, memory, verdict, _tokenizer(backend))
                memory = None if retry is None else retry[0]
                if retry is not None:
                    counts = retry[1]
                    log.info("rejected output for %s (%s): %r; retrying once", request.agent_id, verdict.problem, raw)
            raise RejectedOutputError(attempts[-1].problem or "rejected")
    except TimeoutError:
        reason, detail = "timeout", f"no reply within {limit:.2f}s"
        warn(reason, "backend %s timed out for %s after %.2fs", backend.name, request.agent_id, limit)
    except BackendTimeoutError as exc:
        reason, detail = "timeout", str(exc)
        warn(reason, "backend %s timed out: %s", backend.name, exc)
    except CircuitOpenError as exc:
        reason, detail = "circuit_open", str(exc)
        warn(reason, "backend %s: %s", backend.name, exc)
    except RejectedOutputError as exc:
        reason, detail = "rejected", str(exc)
        warn(reason, "output for %s rejected (%s); using the fallback line", request.agent_id, exc)
    except InferenceError as exc:
        reason, detail = "backend_error", str(exc)
        warn(reason, "backend %s failed: %s", backend.name, exc)
    if in_flight is not None:
        attempts.append(msgspec.structs.replace(in_flight, problem=f"{reason}: {detail}"))
    backend_ms = (time.perf_counter() - started) * 1000
    return fallback_result(
        request, reason, backend=backend.name, model=backend.model, raw_response=raw,
        timings={"backend_ms": backend_ms}, worker=worker, attempts=tuple(attempts), counts=counts,
    )
