"""`Dispatch`: what the pool calls to have a request answered, whatever carries it; and the
fallback every dispatch answers with instead of raising.

The pool (`sim.inference._pool`) holds the slots and the priority order; a transport
hands it one `Dispatch`: in-process, serving on a backend here (`sim.inference._serve`);
in the shard's worker process (`sim.inference._local`); over MQTT, the pool's link to the
remote workers (`sim.inference._link`). A dispatch never raises for a backend or
transport failure: it answers with `fallback_result`, so an NPC never goes silent because
a model failed. The fallback line is chosen by SHA-256 of (agent, tick, seed), never by
`hash()`, so that it is the same in every process whatever PYTHONHASHSEED is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeAlias

from sim.audit import Attempt
from sim.wire.inference import InferenceRequest, InferenceResult

__all__ = ["GENERIC_LINES", "Dispatch", "fallback_line", "fallback_result"]

Dispatch: TypeAlias = Callable[[InferenceRequest], Awaitable[InferenceResult]]

# Persona-neutral lines for an NPC that was given none of its own.
GENERIC_LINES: tuple[str, ...] = (
    "Hmm, give me a moment to think on that.",
    "Let me mull that over.",
    "I'd rather not say just now.",
    "Ask me again in a little while.",
)


def fallback_line(agent_id: str, tick: int, seed: int, lines: Sequence[str] = ()) -> str:
    """One of `lines` (or of the generic ones when empty), the same for the same inputs."""
    choices = [line for line in lines if line.strip()] or list(GENERIC_LINES)
    digest = hashlib.sha256(f"{agent_id}\x00{tick}\x00{seed}".encode()).digest()
    return choices[int.from_bytes(digest[:8], "big") % len(choices)]


def fallback_result(
    request: InferenceRequest,
    reason: str,
    *,
    backend: str,
    model: str,
    raw_response: str | None = None,
    timings: dict[str, float] | None = None,
    worker: str = "",
    attempts: tuple[Attempt, ...] = (),
    counts: dict[str, int] | None = None,
) -> InferenceResult:
    """The NPC's deterministic fallback line, recording why it was used (and the server's
    token counts a retry's working memory was cut with, when one was made)."""
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
        attempts=attempts,
        counts=counts or {},
    )
