"""The one backoff of npcsim: jittered exponential waits that start over after a success.

Every retry loop uses it (MQTT reconnection, the bus's failed publishes, the inference
link's re-sends, the openai backend's retries), so they all back off the same way:

    backoff = Backoff(BackoffPolicy(initial=0.1, maximum=5.0))
    await asyncio.sleep(backoff.next())      # after each failure
    backoff.reset()                          # after a success

Pure: it computes waits and never sleeps; the caller sleeps (on its own clock).
"""

from __future__ import annotations

import random

import msgspec

__all__ = ["Backoff", "BackoffPolicy"]


class BackoffPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The first wait's cap and the largest cap, in seconds."""

    initial: float = 0.1
    maximum: float = 5.0


class Backoff:
    """The n-th wait is uniform in [cap/2, cap], the cap doubling from `initial` up to `maximum`.

    Jitter keeps many clients that failed together from retrying together.
    """

    def __init__(self, policy: BackoffPolicy, rng: random.Random | None = None) -> None:
        self._policy = policy
        self._rng = rng or random.Random()
        self.attempts = 0

    def next(self) -> float:
        """The wait before the next attempt; each call counts one attempt."""
        cap = min(self._policy.maximum, self._policy.initial * 2**self.attempts)
        self.attempts += 1
        return self._rng.uniform(cap / 2, cap)

    def reset(self) -> None:
        """After a success the next failure starts from the shortest wait again."""
        self.attempts = 0
