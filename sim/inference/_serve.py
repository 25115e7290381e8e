"""Serving one request: what a worker does, in-process or remote.

Drop it when stale, call the backend within the time left, clean and judge the output,
retry once with a prohibition when the output is rejected, and answer with the fallback
line whenever anything fails: `serve` never raises for a backend failure.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

import msgspec

from sim.errors import BackendTimeoutError, CircuitOpenError, InferenceError, RejectedOutputError
from sim.inference._fallback import fallback_line
from sim.inference._output import judge
from sim.inference._types import InferenceRequest, InferenceResult, PoolStatistics, Reply
from sim.inference.backends import Backend

__all__ = ["Counters", "LogOnce", "fallback_result", "serve", "with_timings"]

log = logging.getLogger(__name__)


class LogOnce:
    """Log the first occurrence of each kind as a warning, later ones at debug level."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()

    def __call__(self, kind: str, message: str, *args: object) -> None:
        level = logging.DEBUG if kind in self._seen else logging.WARNING
        self._seen.add(kind)
        self._logger.log(level, message, *args)


class Counters:
    """The mutable counters behind `statistics()`."""

    def __init__(self) -> None:
        self.requests = 0
        self.completed = 0
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.dropped_stale = 0
        self.rejected_outputs = 0
        self.in_flight = 0
        self.in_flight_peak = 0
        self.waiting = 0
        self.malformed = 0
        self.late_replies = 0
        self.retries = 0

    def count_result(self, result: InferenceResult) -> None:
        self.completed += 1
        if result.fallback:
            self.fallbacks[result.fallback_reason or "unknown"] += 1

    def snapshot(self) -> PoolStatistics:
        return PoolStatistics(
            requests=self.requests,
            completed=self.completed,
            fallbacks=dict(sorted(self.fallbacks.items())),
            dropped_stale=self.dropped_stale,
            rejected_outputs=self.rejected_outputs,
            in_flight=self.in_flight,
            in_flight_peak=self.in_flight_peak,
            waiting=self.waiting,
            malformed=self.malformed,
            late_replies=self.late_replies,
            retries=self.retries,
        )


def fallback_result(
    request: InferenceRequest,
    reason: str,
    *,
    backend: str,
    model: str,
    raw_response: str | None = None,
    timings: dict[str, float] | None = None,
    worker: str = "",
) -> InferenceResult:
    """The NPC's deterministic fallback line, recording why it was used."""
    return InferenceResult(
        id=request.id,
        agent_id=request.agent_id,
        tick=request.tick,
        line=fallback_line(request.agent_id, request.tick, request.seed, request.fallback_lines),
        raw_response=raw_response,
        backend=backend,
        model=model,
        fallback=True,
        fallback_reason=reason,
        timings=timings or {},
        worker=worker,
    )


async def serve(
    request: InferenceRequest,
    backend: Backend,
    *,
    time_limit: float,
    max_line_chars: int,
    counters: Counters,
    worker: str = "",
    clock: Callable[[], float] = time.time,
    warn: LogOnce | None = None,
) -> InferenceResult:
    """Answer one request; a fallback result whenever the backend cannot give a usable line.

    `time_limit` (seconds) bounds the backend's time together with the request's deadline;
    it is a parameter, not the caller's timeout scope, because the fallback must still be
    produced when it runs out.
    """
    started = time.perf_counter()
    warn = warn or LogOnce(log)
    left = request.deadline - clock()
    if left <= 0:
        counters.dropped_stale += 1
        log.debug("dropped stale request %s of %s (%.3fs past its deadline)", request.id, request.agent_id, -left)
        return fallback_result(request, "stale", backend=backend.name, model=backend.model, worker=worker)
    raw: str | None = None
    reply: Reply | None = None
    reason: str
    try:
        async with asyncio.timeout(min(time_limit, left)):
            reply = await backend.generate(request.memory, None)
            raw = reply.text
            verdict = judge(reply.text, request.memory, max_line_chars)
            if verdict.problem is not None:
                counters.rejected_outputs += 1
                log.info("rejected output for %s (%s): %r; retrying once", request.agent_id, verdict.problem, raw)
                counters.retries += 1
                reply = await backend.generate(request.memory, verdict.prohibition)
                raw = reply.text
                verdict = judge(reply.text, request.memory, max_line_chars)
                if verdict.problem is not None:
                    counters.rejected_outputs += 1
                    raise RejectedOutputError(verdict.problem)
        backend_ms = (time.perf_counter() - started) * 1000
        return InferenceResult(
            id=request.id,
            agent_id=request.agent_id,
            tick=request.tick,
            line=verdict.line,
            raw_response=raw,
            backend=backend.name,
            model=reply.model,
            params=reply.params,
            timings={"backend_ms": backend_ms},
            tokens=reply.tokens,
            worker=worker,
        )
    except TimeoutError:
        reason = "timeout"
        warn(reason, "backend %s timed out for %s after %.2fs", backend.name, request.agent_id, min(time_limit, left))
    except BackendTimeoutError as exc:
        reason = "timeout"
        warn(reason, "backend %s timed out: %s", backend.name, exc)
    except CircuitOpenError as exc:
        reason = "circuit_open"
        warn(reason, "backend %s: %s", backend.name, exc)
    except RejectedOutputError as exc:
        reason = "rejected"
        warn(reason, "output for %s rejected twice (%s); using the fallback line", request.agent_id, exc)
    except InferenceError as exc:
        reason = "backend_error"
        warn(reason, "backend %s failed: %s", backend.name, exc)
    backend_ms = (time.perf_counter() - started) * 1000
    return fallback_result(
        request, reason, backend=backend.name, model=backend.model, raw_response=raw,
        timings={"backend_ms": backend_ms}, worker=worker,
    )


def with_timings(result: InferenceResult, **timings: float) -> InferenceResult:
    return msgspec.structs.replace(result, timings={**result.timings, **timings})
