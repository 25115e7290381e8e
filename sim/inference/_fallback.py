"""The deterministic fallback line: an NPC never goes silent because a model failed.

The line is chosen by SHA-256 of (agent, tick, seed), never by `hash()`, so that it is the
same in every process whatever PYTHONHASHSEED is. `fallback_result` is the answer that
carries it, for every end of the path that gives up on a request (a worker, the link).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from sim.audit import Attempt
from sim.wire.inference import InferenceRequest, InferenceResult

__all__ = ["GENERIC_LINES", "fallback_line", "fallback_result"]

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
        attempts=attempts,
    )
