"""The deterministic fallback line: an NPC never goes silent because a model failed.

The line is chosen by SHA-256 of (agent, tick, seed), never by `hash()`, so that it is the
same in every process whatever PYTHONHASHSEED is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["GENERIC_LINES", "fallback_line"]

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
