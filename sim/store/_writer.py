"""The store's one writer task and the bounded queue of operations its producers fill.

Every write is one `Row` on the queue. The task drains the queue, seals the rows
(sim.store.seals), groups them by statement and runs each group as one bulk statement
(`sim.store.sql.BULK`) inside one open transaction; a `Commit` commits it (recording the
tick in `meta` when it ends one, with the transaction's link of the chain:
sim.store._chain), so a tick is either wholly on disk or not at all. Thousands of agents
writing at once never wait on one another's commits, only (when the queue is full) on the
writer: that is the backpressure.

On `Close` the task writes and commits what is queued, or, with `keep_tail=False`, rolls
back the unfinished tail (rows queued after the last commit are dropped unwritten, and
the open transaction is rolled back), so after a crash nothing of an unfinished tick is
on disk. After a database error the task keeps draining
(dropping and counting rows, failing waiters) so producers blocked on the full queue are
released, and every later write is refused.

The operations are tagged Structs in one union. `Commit` and `Prune` carry the future
their producer awaits: a future held beside the operation would need a pair per queued
operation, or a second FIFO that falls out of step when a blocked producer is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any, assert_never

import aiosqlite
import msgspec

from sim.errors import StoreError
from sim.store._chain import Seals
from sim.store._items import Addresser
from sim.store._retention import PRUNE_SQL
from sim.store.seals import Sealer
from sim.store.sql import BULK, BULK_REPLACED_BELIEFS, INSERT, REPLACED_BELIEF, RowKind, bulk_parameters

__all__ = ["BatchWriter", "Close", "Commit", "Operation", "Prune", "Row", "Rows"]

log = logging.getLogger(__name__)

_QUEUE_SIZE = 65_536
_BATCH_ROWS = 8_192


class Row(msgspec.Struct, frozen=True, tag=True):
    """One row to write; `values` are its statement's parameters (`INSERT[kind]`)."""

    kind: RowKind
    values: tuple[Any, ...]


class Rows(msgspec.Struct, frozen=True, tag=True):
    """Many rows of one kind, queued as one operation (start-up creates agents by thousands)."""

    kind: RowKind
    rows: list[tuple[Any, ...]]


class Commit(msgspec.Struct, frozen=True, tag=True):
    """Commit what is queued before it, as `tick` when it ends one; `done` is set once on disk."""

    tick: int | None
    done: asyncio.Future[None]


class Prune(msgspec.Struct, frozen=True, tag=True):
    """Delete memories older than each agent's newest `keep`; `done` gets the rows deleted."""

    keep: int
    done: asyncio.Future[int]


class Close(msgspec.Struct, frozen=True, tag=True):
    """Write (or roll back) what is queued, then stop."""


Operation = Row | Rows | Commit | Prune | Close

_Rows = dict[RowKind, list[tuple[Any, ...]]]


class BatchWriter:
    """The queue's producer side (`put`, `commit`, `prune`, `close`) and its one consumer, `run`.

    The counters are read by `Store.statistics()`.
    """

    def __init__(
        self, conn: aiosqlite.Connection, path: Path, addresser: Addresser, seals: Seals, *,
        last_tick: int | None, keep_tail: bool,
    ) -> None:
        self._conn = conn
        self._path = path
        self._addresser = addresser
        self.seals = seals
        self._keep_tail = keep_tail
        self._queue: asyncio.Queue[Operation] = asyncio.Queue(_QUEUE_SIZE)
        self._closing = False
        self._tail_dropped = 0  # rows of the unfinished tick dropped unwritten at close
        self._in_transaction = False
        self._done = asyncio.Event()
        self.failure: StoreError | None = None
        self.last_tick = last_tick  # the last tick committed, also across restarts
        self.rows_queued = 0
        self.rows_written = 0
        self.rows_dropped = 0
        self.rows_pruned = 0
        self.batches = 0
        self.commits = 0
        self.high_water = 0

    def queue_size(self) -> int:
        return self._queue.qsize()

    @property
    def sealer(self) -> Sealer:
        """What rows are sealed and checked with (`Seals.sealer`)."""
        return self.seals.sealer

    # -- producers -----------------------------------------------------------------------

    def check_open(self) -> None:
        self.seals.check_key()
        if self.failure is not None:
            raise StoreError(f"{self._path}: the store's writer failed: {self.failure}") from self.failure
        if self._closing:
            raise StoreError(f"{self._path}: the store is closed")

    async def put(self, kind: RowKind, values: tuple[Any, ...]) -> None:
        """Queue one row; waits while the queue is full."""
        self.check_open()
        self.rows_queued += 1
        await self._queue.put(Row(kind, values))
        size = self._queue.qsize()
        if size > self.high_water:
            self.high_water = size

    async def put_rows(self, kind: RowKind, rows: list[tuple[Any, ...]]) -> None:
        """Queue many rows of one kind as one operation; waits while the queue is full."""
        self.check_open()
        if rows:
            self.rows_queued += len(rows)
            await self._queue.put(Rows(kind, rows))

    async def commit(self, tick: int | None) -> None:
        """Commit everything queued so far (as `tick`, if given); returns once it is on disk."""
        await (await self.queue_commit(tick))

    async def queue_commit(self, tick: int | None) -> asyncio.Future[None]:
        """Queue the commit of everything queued so far (as `tick`, if given); the future is
        done once it is on disk. What is queued after it goes into the next transaction."""
        self.check_open()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put(Commit(tick, done))
        return done

    async def prune(self, keep: int) -> int:
        """Run the pruning statements in the open transaction after what is queued; rows deleted."""
        self.check_open()
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await self._queue.put(Prune(keep, done))
        return await done

    async def close(self) -> None:
        """Flush and commit (or roll back) what is queued, then stop the task."""
        if self._closing:
            return
        self._closing = True
        if not self._keep_tail:
            self._drop_tail()
        if not self._done.is_set():
            await self._queue.put(Close())
            await self._done.wait()

    def _drop_tail(self) -> None:
        """Rows queued after the last commit would be written only to be rolled back: at a
        million NPCs that is seconds of a stopping run. They are dropped unwritten."""
        ops: list[Operation] = []
        while not self._queue.empty():
            ops.append(self._queue.get_nowait())
        last = max((n for n, op in enumerate(ops) if not isinstance(op, Row | Rows)), default=-1)
        for op in ops[: last + 1]:
            self._queue.put_nowait(op)
        self._tail_dropped = sum(len(op.rows) if isinstance(op, Rows) else 1 for op in ops[last + 1 :])

    # -- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        """Drain the queue in batches until closed; on a database error, fail loudly."""
        rows: _Rows = {}
        closing = False
        try:
            while True:
                batch = [await self._queue.get()]
                while len(batch) < _BATCH_ROWS:
                    try:
                        batch.append(self._queue.get_nowait())
                    except asyncio.QueueEmpty:
                        break
                for op in batch:  # isinstance, not match: a class pattern costs more per row
                    if isinstance(op, Row):
                        rows.setdefault(op.kind, []).append(op.values)
                    elif isinstance(op, Rows):
                        rows.setdefault(op.kind, []).extend(op.rows)
                    elif isinstance(op, Commit):
                        await self._write(rows, commit=True, tick=op.tick)
                        self._settle(op.done)
                    elif isinstance(op, Prune):
                        await self._write(rows, commit=False, tick=None)
                        await self._prune(op)
                    elif isinstance(op, Close):
                        closing = True
                    else:
                        assert_never(op)
                if closing and self._queue.empty():
                    if self._keep_tail:
                        await self._write(rows, commit=True, tick=None)
                    else:
                        await self._roll_back(rows)
                    return
                await self._write(rows, commit=False, tick=None)
        finally:
            self._done.set()

    async def _write(self, rows: _Rows, *, commit: bool, tick: int | None) -> None:
        """Run the collected rows in the open transaction; commit it when asked."""
        if self.failure is None:
            try:
                await self._execute(rows)
                if commit:
                    await self._commit_transaction(tick)
            except (sqlite3.Error, StoreError) as exc:
                self._fail(exc)
        self._drop(rows)

    async def _roll_back(self, rows: _Rows) -> None:
        """Forget the unfinished tick: rows not yet run and the open transaction."""
        discarded = bool(rows) or self._in_transaction or self._tail_dropped > 0
        rows.clear()
        if self._in_transaction and self.failure is None:
            try:
                await self._conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                self._fail(exc)
            self._in_transaction = False
        if discarded:
            log.info("%s: rolled back the unfinished tick after %s", self._path, self.last_tick)

    async def _begin(self) -> None:
        if not self._in_transaction:
            await self._conn.execute("BEGIN")
            self._in_transaction = True

    async def _execute(self, rows: _Rows) -> None:
        if not rows:
            return
        self._addresser.address(rows)
        self.seals.seal(rows)
        await self._begin()
        for kind, sql in BULK.items():
            group = rows.pop(kind, None)
            if group:
                if kind == "belief":  # the last of each id, replacing the one on disk
                    group = list({(row[0], row[1]): row for row in group}.values())
                parameters = bulk_parameters(kind, group)
                if kind == "belief":
                    if parameters is None:
                        await self._conn.executemany(REPLACED_BELIEF, [row[:2] for row in group])
                    else:
                        await self._conn.execute(BULK_REPLACED_BELIEFS, parameters)
                if kind == "audit":
                    await self.seals.insert_records(self._conn, group, parameters)
                elif parameters is None:
                    await self._conn.executemany(INSERT[kind], group)
                else:
                    await self._conn.execute(sql, parameters)
                self.rows_written += len(group)
        self.batches += 1

    async def _commit_transaction(self, tick: int | None) -> None:
        link = self.seals.link(tick)
        if link is not None:
            await self._begin()
        if self._in_transaction:
            await self.seals.end(self._conn, link)
            await self._conn.execute("COMMIT")
            self._in_transaction = False
            self.commits += 1
        self.seals.committed(link)
        if tick is not None:
            self.last_tick = tick

    async def _prune(self, op: Prune) -> None:
        deleted = 0
        if self.failure is None:
            try:
                await self._begin()
                for _, sql, takes_keep in PRUNE_SQL:
                    async with self._conn.execute(sql, (op.keep,) if takes_keep else ()) as cursor:
                        deleted += max(cursor.rowcount, 0)
            except sqlite3.Error as exc:
                self._fail(exc)
        if op.done.done():
            return
        if self.failure is not None:
            op.done.set_exception(StoreError(f"{self._path}: pruning failed: {self.failure}"))
        else:
            self.rows_pruned += deleted
            op.done.set_result(deleted)

    def _settle(self, done: asyncio.Future[None]) -> None:
        if done.done():
            return
        if self.failure is not None:
            done.set_exception(StoreError(f"{self._path}: commit failed: {self.failure}"))
        else:
            done.set_result(None)

    def _fail(self, exc: sqlite3.Error | StoreError) -> None:
        self.failure = StoreError(f"{self._path}: write failed: {exc}")
        self.failure.__cause__ = exc
        log.error("store writer failed, further writes are refused: %s", self.failure)

    def _drop(self, rows: _Rows) -> None:
        """Count rows that could not be written (only after a failure)."""
        dropped = sum(len(group) for group in rows.values())
        if dropped:
            self.rows_dropped += dropped
            log.error("dropped %d rows after the writer failed (%d in total)", dropped, self.rows_dropped)
        rows.clear()
