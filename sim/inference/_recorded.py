"""Answering a request with the replies a recorded run got for it (`npcsim replay`, sim.replay).

A re-execution asks the pool exactly what the run asked, and each request is served again
by `serve`, on a backend that gives back the record's attempts in order: the raw reply of
each, or the failure it met (a timeout, an open circuit, a backend error). So output
handling judges every reply anew, a rejected one is retried with the working memory the
re-execution built, and the fallback speaks where it spoke: what differs from the record is
then the run's doing, not the model's. A request the record answered without calling the
backend (stale, a transport error) gets that fallback again. A request asking for more
attempts than were made fails ("no recorded reply"), and the fallback speaks.
"""

from __future__ import annotations

from collections.abc import Iterator

from sim.audit import Attempt, AuditRecord
from sim.errors import BackendTimeoutError, CircuitOpenError, InferenceError
from sim.inference.backends import Reply
from sim.memory import WorkingMemory

__all__ = ["RecordedBackend"]


class RecordedBackend:
    """A backend that gives back one record's attempts, in order (one instance per request)."""

    def __init__(self, record: AuditRecord) -> None:
        self.name = record.backend
        self.model = record.model
        first = record.attempts[0] if record.attempts else Attempt(prompt="")
        self.prompt_form = first.form
        self.prompt_prefix = first.prefix
        self._params = dict(record.params)
        self._attempts: Iterator[Attempt] = iter(record.attempts)
        self._made = 0

    async def generate(self, memory: WorkingMemory) -> Reply:
        self._made += 1
        attempt = next(self._attempts, None)
        if attempt is None:
            raise InferenceError(f"no recorded reply for attempt {self._made}")
        if attempt.raw_response is not None:
            return Reply(text=attempt.raw_response, model=self.model, params=self._params)
        reason, _, detail = (attempt.problem or "backend_error: no reply").partition(": ")
        if reason == "timeout":
            raise BackendTimeoutError(detail)
        if reason == "circuit_open":
            raise CircuitOpenError(detail)
        raise InferenceError(detail or reason)
