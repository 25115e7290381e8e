"""What a pool or a worker counts (`Counters`, read as `PoolStatistics`), and logging once per kind.

Both ends of the inference path count the same things: the in-process pool, the MQTT
link and a remote worker each keep one `Counters`, and `statistics()` hands out a frozen
snapshot. `LogOnce` keeps a failure that repeats at every request (a dead backend, a
forger on the broker) to one warning.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

import msgspec

from sim.wire.inference import InferenceResult

__all__ = ["Counters", "LogOnce", "PoolStatistics"]


class PoolStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a pool's or a worker's counters."""

    requests: int
    completed: int
    fallbacks: dict[str, int]
    dropped_stale: int
    rejected_outputs: int
    in_flight: int
    in_flight_peak: int
    waiting: int
    malformed: int
    late_replies: int
    attempts: int = 0  # calls made to backends for the completed requests (a retry is a second one)
    retries: int = 0  # attempts after the first, over the completed requests
    resent: int = 0  # requests sent to the workers again (an outage, a dead worker's will)
    server_limits: dict[str, int] = {}  # each model server's adaptive limit (an in-process openai backend)


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
        self.attempts = 0
        self.retries = 0
        self.resent = 0
        self.server_limits: Callable[[], dict[str, int]] = dict  # the backend's, when it has several limits

    def count_result(self, result: InferenceResult) -> None:
        self.completed += 1
        self.attempts += len(result.attempts)
        self.retries += max(len(result.attempts) - 1, 0)
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
            attempts=self.attempts,
            retries=self.retries,
            resent=self.resent,
            server_limits=self.server_limits(),
        )


class LogOnce:
    """Log the first occurrence of each kind as a warning, later ones at debug level."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()

    def __call__(self, kind: str, message: str, *args: object) -> None:
        level = logging.DEBUG if kind in self._seen else logging.WARNING
        self._seen.add(kind)
        self._logger.log(level, message, *args)
