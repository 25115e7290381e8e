"""Work over a store's audit records on every core: worker processes over record ranges.

A pass over the audit (`npcsim audit replay`, the what-if of `npcsim replay --set`) is one
pure function per record, so it splits into spans of whole ticks, each read and worked on
by one worker process. Spans are cut so that each holds about the same number of records
(a few per worker, so a slow span does not hold the others up) and are given back in
their order: whatever a caller folds from them is the same as one process reading the
records in order, byte for byte.

The workers are helper processes (`sim.helper`, `sim.replay._span_worker`), each given the
next span as soon as it has handed back the last one. A worker keeps each store it reads
open for its whole life, so the reader's item cache (the bodies records reference) is filled
once per process, not once per span. The work and what it returns cross the pipes pickled,
as they would to a process pool; an error the work raises in a worker is raised here.
"""

from __future__ import annotations

import asyncio
import os
import pickle
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any, TypeVar

import msgspec

from sim.audit import AuditRecord
from sim.errors import ConfigError, NpcsimError, single_error
from sim.helper import Helper
from sim.store import StoreReader, open_reader

__all__ = ["Plan", "Readers", "Span", "Work", "check_jobs", "decode_span", "default_jobs", "map_spans", "plan_spans"]

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


_span_encoder = msgspec.msgpack.Encoder()
_span_decoder = msgspec.msgpack.Decoder(Span)


def decode_span(body: bytes) -> Span:
    """A span as a worker process is sent it."""
    return _span_decoder.decode(body)


class Readers:
    """One open reader per store file, kept for the life of the process that holds it."""

    def __init__(self) -> None:
        self.stack = ExitStack()
        self._open: dict[str, StoreReader] = {}

    def records(self, span: Span) -> Iterable[AuditRecord]:
        reader = self._open.get(span.db)
        if reader is None:
            reader = self._open[span.db] = self.stack.enter_context(open_reader(span.db))
        return reader.audit_records(span.agent, from_tick=span.from_tick, to_tick=span.to_tick)


def map_spans(work: Work[T], plan: Plan, jobs: int) -> list[T]:
    """`work` of each span's records, in span order; with jobs > 1 in that many processes.

    `work` must pickle (a module-level function, or a functools.partial of one); so must
    what it returns.
    """
    if check_jobs(jobs) == 1 or len(plan.spans) <= 1:
        readers = Readers()
        with readers.stack:
            return [work(readers.records(span)) for span in plan.spans]
    return _blocking(_in_workers(work, plan.spans, min(jobs, len(plan.spans))))


def _blocking(work: Coroutine[Any, Any, list[T]]) -> list[T]:
    """Run `work` to its end on an event loop of its own: this thread's, or, when this thread
    runs one already (a caller inside a coroutine), a thread's, blocking the caller alike."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with ThreadPoolExecutor(1, thread_name_prefix="npcsim-spans") as thread:
        return thread.submit(asyncio.run, work).result()


async def _in_workers(work: Work[T], spans: Sequence[Span], workers: int) -> list[T]:
    """Each span's result, in span order, from `workers` worker processes taking the next span as they are free."""
    given = pickle.dumps(work)
    done: dict[int, T] = {}
    order = iter(enumerate(spans))
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(_worker(given, order, done))
    except BaseExceptionGroup as group_error:
        errors = group_error.exceptions
        if all(isinstance(e, NpcsimError) for e in errors):  # each worker met the same bad setting: one line
            raise errors[0] from None
        raise single_error(group_error) from None
    return [done[n] for n in range(len(spans))]


async def _worker(given: bytes, order: Iterator[tuple[int, Span]], done: dict[int, Any]) -> None:
    """One worker process over the spans not yet taken; it ends with them."""
    worker = await Helper.start("sim.replay._span_worker", given, what="audit worker")
    try:
        for n, span in order:
            worker.send(_span_encoder.encode(span))
            body = await worker.read()
            if body is None:
                code = await worker.ended()
                raise NpcsimError(f"an audit worker process ended (exit code {code}) while reading {span.db}")
            ok, value = pickle.loads(body)  # from our own child: the same program
            if not ok:
                raise value
            done[n] = value
        await worker.stop()
    except BaseException:
        await worker.abort()
        raise
