"""The store's façade: `open_store` and `Store`, wiring the parts that each do one job.

| module | its job |
|---|---|
| `_agents` | each agent's state with authority: loaded, created, written (`Store`'s base) |
| `_authority` | who may write what, the violation count |
| `_hot` | each loaded agent's bounded state in memory, loading it from disk |
| `_writer` | the one writer task: queued operations, batching, commits, failure |
| `seals`, `_chain`, `_verify` | seals on what a resume reads, the chain over the audit and inputs, their checks |
| `_items` | content addressing of episodes, events and audit records before they are written |
| `_places` | the places' logs: a place's events of a tick as one row, loaded in one query; their summaries |
| `_resume` | resume metadata (`Store.resume`): what a tick replaces, the inputs and world changes it took |
| `_arrivals` | the arrivals journal (`Store.arrivals`): outside input on disk as it arrives, until its tick commits |
| `_identity` | the run the store belongs to (`RunIdentity`) |
| `_lock` | one writer per store: the lock file held while it is open |
| `sql` | the statements |

Every write is checked (`_authority`), updates the agent's hot state at once (so `state()`
never queries) and queues one row for the writer task, which commits a tick's rows
together; `commit_tick` commits a tick with what it replaces, in the order a resume
needs. `open_store` takes the writer lock, opens the file, runs the writer in a
TaskGroup and, on exit, flushes (or, with `keep_tail=False`, rolls back) what was queued
after the last commit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import aiosqlite
import msgspec

from sim.audit import AuditRecord
from sim.errors import SchemaError, StoreError, TamperError
from sim.protocol.seal import RunKey
from sim.store._agents import AgentStore
from sim.store._arrivals import Arrivals
from sim.store._chain import LAST_LINK, ChainEnd, Link, Seals
from sim.store._identity import RunIdentity, decode_identity, encode_identity
from sim.store._items import Addresser, event_item
from sim.store._lock import hold_writer_lock
from sim.store._places import PlaceRows, Summaries, Summary, load_place_log, load_summaries
from sim.store._resume import Resume, TickRecord, read_last_tick
from sim.store._schema import SCHEMA, SCHEMA_VERSION, check_file, check_version
from sim.store._verify import check_opening
from sim.store._writer import BatchWriter
from sim.store.files import check_store_file
from sim.store.records import COLUMNS, RecordPacker
from sim.store.seals import Sealer, digest
from sim.store.sql import INSERT, SELECT_AGENT_KEYS, SELECT_META, SELECT_RUN
from sim.wire.events import AnyEvent

__all__ = ["HOT_LIMIT", "Store", "StoreStatistics", "open_store"]

log = logging.getLogger(__name__)

_JSON = msgspec.json.Encoder()
_MSGPACK = msgspec.msgpack.Encoder()

# Newest items kept in memory per agent and category: at least the largest default count
# cap (10 dialogue lines), with room for configs that raise the caps.
HOT_LIMIT = 32
_CACHE_KIB = -65_536  # SQLite's page cache, negative: in KiB
_WRITTEN = "SELECT EXISTS (SELECT 1 FROM run) OR EXISTS (SELECT 1 FROM agents) OR EXISTS (SELECT 1 FROM chain)"


class StoreStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters since the store was opened."""

    rows_queued: int
    rows_written: int
    rows_dropped: int  # queued after the writer failed, never written
    batches: int
    commits: int
    last_tick: int | None
    authority_violations: int
    hot_agents: int
    queue_size: int
    queue_high_water: int
    rows_pruned: int = 0


class Store(AgentStore):
    """An open store; use `open_store`. Methods are safe to call from many tasks."""

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: Path,
        writer: BatchWriter,
        hot_limit: int,
        arrivals: Arrivals,
        opened: _Opened,
    ) -> None:
        super().__init__(conn, path, writer, hot_limit)
        self._arrivals = arrivals
        self._opened = opened
        self._identity = opened.identity
        self._packer = RecordPacker()
        self._resume = Resume(conn, path, writer)

    # -- introspection ------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def last_tick(self) -> int | None:
        """The last tick committed with `end_tick` (also across restarts), for --resume."""
        return self._writer.last_tick

    @property
    def identity(self) -> RunIdentity | None:
        """The run this store belongs to; None until a first start writes it (`keep_identity`)."""
        return self._identity

    def statistics(self) -> StoreStatistics:
        w = self._writer
        return StoreStatistics(
            rows_queued=w.rows_queued,
            rows_written=w.rows_written,
            rows_dropped=w.rows_dropped,
            batches=w.batches,
            commits=w.commits,
            last_tick=w.last_tick,
            authority_violations=self._authority.violations,
            hot_agents=len(self._hot),
            queue_size=w.queue_size(),
            queue_high_water=w.high_water,
            rows_pruned=w.rows_pruned,
        )

    async def add_place_events(
        self, place: str, tick: int, events: Sequence[AnyEvent], *, since: int | None = None
    ) -> None:
        """Queue a place's events appended to its log at `tick` as one row (each event an item,
        stored once); `since`, when given, is the tick from which the place's log is needed now."""
        await self._writer.put("place", (place, tick, [event_item(event) for event in events]))
        if since is not None:
            await self._writer.put("place_window", (place, since))

    async def place_log(self) -> PlaceRows:
        """Every place's committed log from the tick its window needs, in one query."""
        try:
            return await load_place_log(self._conn, self._writer.sealer, str(self._path))
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: loading the places' logs failed: {exc}") from exc

    async def add_summary(self, place: str, summary: Summary) -> None:
        """Queue a summary of the place's talk into its slot (replacing the slot's older one)."""
        events = _JSON.encode(summary.events).decode()
        await self._writer.put("summary", (place, summary.slot, events, _MSGPACK.encode(summary.episode)))

    async def summaries(self) -> Summaries:
        """Every place's committed summaries, by slot, with the events each folds."""
        try:
            return await load_summaries(self._conn, self._writer.sealer, str(self._path))
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: loading the places' summaries failed: {exc}") from exc

    async def record(self, record: AuditRecord) -> None:
        """Queue one audit record; the first record of an inference id wins."""
        blob, items = self._packer.pack(record)
        columns = [getattr(record, name) for name in COLUMNS]
        columns[COLUMNS.index("fallback")] = int(record.fallback)  # as SQLite gives it back: its digest is the same
        await self._writer.put("audit", (*columns, blob, items))

    async def seal_with(self, key: RunKey | None, key_name: str = "a run key") -> None:
        """Seal what this store writes with the run key `key` (None: digests only, which catch an
        accidental edit, not a forger); before its first write.

        First, what a start reads before anything else is checked with it: that the store was
        sealed with this key, its identity, scenario and last tick, every link of its chain
        (what the links digest is `npcsim audit verify`'s to read), and the arrivals journal.
        Every load checks its rows with it from then on. TamperError names what does not verify;
        a key that is not the store's is a StoreError naming `key_name` (where the key came from).
        """
        w = self._writer
        if w.rows_queued or w.commits or self._arrivals.opened:
            raise StoreError(f"{self._path}: a store is given its run key before its first write, not after")
        sealer, opened = Sealer(key), self._opened
        first = sealer.keyed and opened.marker == Sealer().check and not await self._written()
        # a store nothing was written to yet is sealed with no key until given one: it takes this
        await check_opening(self._conn, self._path, Sealer() if first else sealer, key_name, opened.marker,
                            opened.store_id)
        w.seals.use(sealer, mark=first)
        self._arrivals.open(sealer)

    async def _written(self) -> bool:
        """Whether anything of a run was written to the store (an identity, an agent, a commit)."""
        try:
            async with self._conn.execute(_WRITTEN) as cursor:
                row = await cursor.fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: cannot read the database: {exc}") from exc
        return bool(row and row[0])

    # -- the run and its ticks -----------------------------------------------------------

    async def keep_identity(self, identity: RunIdentity, scenario: bytes | None = None) -> None:
        """Record the run this store belongs to, and the bytes of its scenario when given,
        committed at once (with what was queued before)."""
        await self._writer.put("run", (encode_identity(identity),))
        if scenario is not None:
            await self._writer.put("scenario", (identity.scenario_sha256, scenario))
        await self._writer.commit(None)
        self._identity = identity

    @property
    def resume(self) -> Resume:
        """What a resume reads back, and the inputs and world changes each tick took."""
        return self._resume

    @property
    def arrivals(self) -> Arrivals:
        """The arrivals journal: outside input on disk as it arrives, with the tick that takes it
        (opened, with the store's seals, at its first use when `seal_with` did not open it)."""
        if not self._arrivals.opened:
            self._arrivals.open(self._writer.sealer)
        return self._arrivals

    async def commit_tick(self, tick: int, record: TickRecord) -> asyncio.Future[None]:
        """Queue tick `tick`'s commit with what it replaces; the future is done once it is on disk.

        The order makes a resume exact: what the tick keeps for the next (`record`) is queued
        with its rows, the arrivals it took are flushed to the disk (an fdatasync, in a
        thread) before the commit can run, and the journal drops them once the commit is on
        disk. What is queued meanwhile belongs to the next tick, so the next tick's work goes
        on while SQLite writes this one.
        """
        await self._resume.keep(record)
        await asyncio.to_thread(self.arrivals.sync)
        return await self._queue_commit(tick)

    async def end_tick(self, tick: int) -> None:
        """Commit everything queued so far as tick `tick`; returns once it is on disk."""
        await (await self._queue_commit(tick))

    async def _queue_commit(self, tick: int) -> asyncio.Future[None]:
        last = self._writer.last_tick
        if last is not None and tick < last:
            raise StoreError(f"{self._path}: end_tick({tick}) after tick {last} was committed")
        done = await self._writer.queue_commit(tick)
        arrivals = self._arrivals

        def committed(future: asyncio.Future[None]) -> None:
            if not future.cancelled() and future.exception() is None:
                arrivals.committed(tick)

        done.add_done_callback(committed)
        return done

    async def flush(self) -> None:
        """Commit everything queued so far without ending a tick."""
        await self._writer.commit(None)

    async def prune_memories(self, keep: int) -> int:
        """Delete memories older than each agent's newest `keep` per category; rows deleted.

        `keep` below the hot limit is refused: what a working memory can use is never
        pruned, and neither is anything an audit record references (sim/store/_retention.py).
        The deletion is committed with the next commit.
        """
        if keep < self._limit:
            raise StoreError(f"{self._path}: keeping {keep} memories per category is below the hot limit {self._limit}")
        return await self._writer.prune(keep)



@asynccontextmanager
async def open_store(
    path: str | os.PathLike[str], *, hot_limit: int = HOT_LIMIT, create: bool = True, keep_tail: bool = True
) -> AsyncIterator[Store]:
    """Open (or create) a store file as its one writer; on exit, flush and commit everything queued.

    Another process writing the file is refused with StoreError naming it (sim.store._lock);
    readers (`open_reader`) are not affected. The exit flushes whatever ended the block
    (normal end, an error, a cancellation from SIGTERM or Ctrl-C); only SIGKILL loses the
    uncommitted tail, never a committed tick. With `keep_tail=False` the exit rolls the
    uncommitted tail back instead: only whole ticks are ever on disk.
    """
    if hot_limit < 1:
        raise StoreError(f"hot_limit must be >= 1, got {hot_limit}")
    p = Path(path)
    check_store_file(p)
    check_file(p, must_exist=not create)
    with hold_writer_lock(p):
        async with _open_locked(p, hot_limit, keep_tail) as store:
            yield store


@asynccontextmanager
async def _open_locked(p: Path, hot_limit: int, keep_tail: bool) -> AsyncIterator[Store]:
    try:
        conn = await aiosqlite.connect(p, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"{p}: cannot open the database: {exc}") from exc
    try:
        opened = await _prepare(conn, p)
        seals = Seals(p, ChainEnd(opened.last_link, opened.store_id), opened.marker)
        writer = BatchWriter(conn, p, Addresser(opened.agent_keys), seals, last_tick=opened.last_tick,
                             keep_tail=keep_tail)
        arrivals = Arrivals(p, opened.last_tick, opened.store_id)
        store = Store(conn, p, writer, hot_limit, arrivals, opened)
        error: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(writer.run())
                try:
                    yield store
                except BaseException as exc:  # noqa: BLE001 - re-raised below, unwrapped by the TaskGroup
                    error = exc
                finally:
                    await writer.close()
        finally:
            arrivals.close()
        if error is not None:
            raise error
        if writer.failure is not None:
            raise writer.failure
    finally:
        await conn.close()


class _Opened(NamedTuple):
    """What an opened store holds that its parts start from."""

    last_tick: int | None
    agent_keys: dict[str, int]
    identity: RunIdentity | None
    store_id: bytes  # `meta.store`: where its chain and its journal's MACs begin
    marker: int  # `meta.seal`: the check value of the key it is sealed with
    last_link: Link | None


async def _prepare(conn: aiosqlite.Connection, path: Path) -> _Opened:
    """Refuse foreign databases and other schema versions, switch to WAL, create the schema
    (and the store's own id) in a new file; what the store's parts start from."""
    try:
        version = await _scalar(conn, "PRAGMA user_version")
        check_version(path, version)
        if version == 0 and await _scalar(conn, "SELECT count(*) FROM sqlite_master"):
            raise SchemaError(f"{path}: an SQLite database, but not an npcsim store; the file is left untouched")
        await conn.execute("PRAGMA journal_mode = WAL")
        await conn.execute("PRAGMA synchronous = NORMAL")
        # Content-addressed items land at random places in their B-tree: a larger page
        # cache (64 MiB instead of SQLite's 2 MiB default) keeps those inserts off the disk.
        await conn.execute(f"PRAGMA cache_size = {_CACHE_KIB}")
        if version == 0:
            await conn.execute("BEGIN IMMEDIATE")
            for statement in SCHEMA:
                await conn.execute(statement)
            store_id, check = secrets.token_bytes(16), Sealer().check  # sealed with no key until given one
            await conn.execute(INSERT["meta"], ("store", digest("meta", ("store", store_id)), store_id))
            await conn.execute(INSERT["meta"], ("seal", digest("meta", ("seal", check)), check))
            await conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            await conn.execute("COMMIT")
        last_tick = await read_last_tick(conn)
        async with conn.execute(SELECT_AGENT_KEYS) as cursor:
            agent_keys = {str(agent): int(n) for agent, n in await cursor.fetchall()}
        async with conn.execute(SELECT_RUN) as cursor:
            row = await cursor.fetchone()
        meta: dict[str, Any] = {}  # the value of each row found
        for key in ("store", "seal"):
            async with conn.execute(SELECT_META, (key,)) as cursor:
                if (found := await cursor.fetchone()) is not None:
                    meta[key] = found[1]
        async with conn.execute(LAST_LINK) as cursor:
            link = await cursor.fetchone()
    except sqlite3.DatabaseError as exc:
        raise SchemaError(f"{path}: cannot use the database: {exc}") from exc
    for key, what in (("store", "the store's own id"), ("seal", "the check value of its key")):
        if key not in meta:
            raise TamperError(f"{path}: {what} (meta {key!r}) is missing: it was edited outside npcsim")
    return _Opened(last_tick=last_tick, agent_keys=agent_keys,
                   identity=None if row is None else _identity(path, row[0]), store_id=bytes(meta["store"]),
                   marker=int(meta["seal"]), last_link=None if link is None else Link(*link))


def _identity(path: Path, text: str) -> RunIdentity:
    try:
        return decode_identity(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SchemaError(f"{path}: the run identity it holds is unreadable: {exc}") from exc


async def _scalar(conn: aiosqlite.Connection, sql: str) -> int:
    async with conn.execute(sql) as cursor:
        row = await cursor.fetchone()
    return 0 if row is None else int(row[0])
