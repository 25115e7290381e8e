"""What a pool or a worker counts (`Counters`, read as `PoolStatistics`), and logging once per kind.

Both ends of the inference path count the same things: the in-process pool, the MQTT
link and a remote worker each keep one `Counters`, and `statistics()` hands out a frozen
snapshot. The model servers' adaptive limits are read where they are kept: from the
backend serving in this process once it served (`served_limits`), and, for a worker process
and remote workers, from what each said last (`hear_limits`: a worker process with each
frame of results, a remote worker on its status topic); a server's limit is the sum over the
workers that spoke of it (what it may get at once from all of them) until a worker is gone
(`forget_worker`). `LogOnce` keeps a failure that repeats at every request (a dead backend,
a forger on the broker) to one warning.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

import msgspec

from sim.wire.inference import InferenceResult

__all__ = ["MAX_WORKERS", "Counters", "LogOnce", "PoolStatistics"]

MAX_WORKERS = 256
"""Workers whose limits a pool keeps: more (forged ones) count for nothing there."""


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
    server_limits: dict[str, int] = {}  # each model server's adaptive limit, summed over the workers serving on it


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
        self.worker_limits: dict[str, dict[str, int]] = {}  # each worker's latest word on its limits
        self.served_limits: Callable[[], dict[str, int]] | None = None
        """The limits of the backend serving in this process, once it served (`sim.inference._serve`)."""

    def forget_worker(self, worker: str) -> None:
        """A worker is gone: its limits no longer count."""
        self.worker_limits.pop(worker, None)

    def hear_limits(self, worker: str, limits: dict[str, int]) -> None:
        """What `worker` said of its servers' limits (a pool keeps at most MAX_WORKERS workers')."""
        if worker in self.worker_limits or len(self.worker_limits) < MAX_WORKERS:
            self.worker_limits[worker] = limits

    def server_limits(self) -> dict[str, int]:
        """Each server's limit, summed over the workers that serve on it."""
        total: collections.Counter[str] = collections.Counter()
        for limits in self.worker_limits.values():
            total.update(limits)
        if self.served_limits is not None:
            total.update(self.served_limits())
        return dict(sorted(total.items()))

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
