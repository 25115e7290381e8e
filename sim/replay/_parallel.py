"""Work over a store's audit records on every core: worker processes over record ranges.

A pass over the audit (`npcsim audit replay`, the what-if of `npcsim replay --set`) is one
pure function per record, so it splits into spans of whole ticks, each read and worked on
by one worker process. Spans are cut so that each holds about the same number of records
(a few per worker, so a slow span does not hold the others up) and are given back in
their order: whatever a caller folds from them is the same as one process reading the
records in order, byte for byte.

A worker keeps each store it reads open for its whole life, so the reader's item cache
(the bodies records reference) is filled once per process, not once per span. Workers are
forked where the platform allows (no re-import of npcsim per worker: a pass over a few
thousand records takes a second).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from itertools import repeat
from typing import TypeVar

import msgspec

from sim.audit import AuditRecord
from sim.errors import ConfigError
from sim.store import StoreReader, open_reader

__all__ = ["Plan", "Span", "check_jobs", "default_jobs", "map_spans", "plan_spans"]

T = TypeVar("T")

_SPANS_PER_JOB = 4

Work = Callable[[Iterable[AuditRecord]], T]


class Span(msgspec.Struct, frozen=True):
    """The records of store `db` with from_tick <= tick <= to_tick (of `agent`, when set)."""

    db: str
    from_tick: int
    to_tick: int
    agent: str | None = None


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """The spans of a pass, in record order, and what planning learnt on the way."""

    spans: tuple[Span, ...]
    records: int
    agents: frozenset[str]


def default_jobs() -> int:
    """Every core: os.cpu_count()."""
    return os.cpu_count() or 1


def check_jobs(jobs: int) -> int:
    """`jobs`, refused in one line when below 1."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    return jobs


def plan_spans(paths: Sequence[str], jobs: int, *, agent: str | None = None) -> Plan:
    """Cut the records of every store (in the order given) into spans of whole ticks."""
    per_db: list[tuple[str, Counter[int]]] = []
    agents: set[str] = set()
    for path in paths:
        with open_reader(path) as reader:
            summaries = reader.audit_summaries(agent)
        per_db.append((path, Counter(s.tick for s in summaries)))
        agents.update(s.agent_id for s in summaries)
    total = sum(sum(counts.values()) for _, counts in per_db)
    size = max(1, -(-total // (check_jobs(jobs) * _SPANS_PER_JOB)))
    spans: list[Span] = []
    for path, counts in per_db:
        start: int | None = None
        held = 0
        ticks = sorted(counts)
        for tick in ticks:
            start = tick if start is None else start
            held += counts[tick]
            if held >= size:
                spans.append(Span(path, start, tick, agent))
                start, held = None, 0
        if start is not None:
            spans.append(Span(path, start, ticks[-1], agent))
    return Plan(spans=tuple(spans), records=total, agents=frozenset(agents))


class _Readers:
    """One open reader per store file, kept for the life of the process that holds it."""

    def __init__(self) -> None:
        self.stack = ExitStack()
        self._open: dict[str, StoreReader] = {}

    def records(self, span: Span) -> Iterable[AuditRecord]:
        reader = self._open.get(span.db)
        if reader is None:
            reader = self._open[span.db] = self.stack.enter_context(open_reader(span.db))
        return reader.audit_records(span.agent, from_tick=span.from_tick, to_tick=span.to_tick)


_WORKER_READERS = _Readers()  # a worker process's; the parent's are per call


def _in_worker(work: Work[T], span: Span) -> T:
    return work(_WORKER_READERS.records(span))


def map_spans(work: Work[T], plan: Plan, jobs: int) -> list[T]:
    """`work` of each span's records, in span order; with jobs > 1 in that many processes.

    `work` must pickle (a module-level function, or a functools.partial of one); so must
    what it returns.
    """
    if check_jobs(jobs) == 1 or len(plan.spans) <= 1:
        readers = _Readers()
        with readers.stack:
            return [work(readers.records(span)) for span in plan.spans]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(max_workers=min(jobs, len(plan.spans)), mp_context=context) as pool:
        return list(pool.map(_in_worker, repeat(work), plan.spans))
