"""The store's façade: `open_store` and `Store`, wiring the parts that each do one job.

| module | its job |
|---|---|
| `_authority` | who may write what, the violation count |
| `_hot` | each loaded agent's bounded state in memory, loading it from disk |
| `_writer` | the one writer task: queued operations, batching, commits, failure |
| `_items` | content addressing of episodes, events and audit records before they are written |
| `_places` | the places' logs: a place's events of a tick as one row, loaded in one query |
| `_resume` | resume metadata: the last tick, what was sent, what waits for the next tick, outside inputs |
| `_arrivals` | the arrivals journal: outside input on disk as it arrives, until its tick commits |
| `_identity` | the run the store belongs to (`RunIdentity`) |
| `_lock` | one writer per store: the lock file held while it is open |
| `sql` | the statements |

Every write is checked (`_authority`), updates the agent's hot state at once (so `state()`
never queries) and queues one row for the writer task, which commits a tick's rows
together. `open_store` takes the writer lock, opens the file, runs the writer in a
TaskGroup and, on exit, flushes (or, with `keep_tail=False`, rolls back) what was queued
after the last commit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import msgspec

from sim.audit import AuditRecord
from sim.errors import SchemaError, StoreError
from sim.memory import Belief, Episode, Fact, Line, NpcState, WorldFact
from sim.store._arrivals import Arrival, Arrivals
from sim.store._authority import Authority, Writer
from sim.store._hot import Hot, load_hot
from sim.store._identity import RunIdentity, decode_identity, encode_identity
from sim.store._items import Addresser, episode_item, event_item
from sim.store._lock import hold_writer_lock
from sim.store._places import PlaceRows, load_place_log
from sim.store._resume import Pending, Resume, read_last_tick
from sim.store._schema import SCHEMA, SCHEMA_VERSION, check_file, check_version
from sim.store._writer import BatchWriter
from sim.store.records import COLUMNS, RecordPacker
from sim.store.sql import SELECT_AGENT_KEYS, SELECT_RUN, RowKind
from sim.wire.events import AnyEvent

__all__ = ["HOT_LIMIT", "Store", "StoreStatistics", "open_store"]

log = logging.getLogger(__name__)

# Newest items kept in memory per agent and category: at least the largest default count
# cap (10 dialogue lines), with room for configs that raise the caps.
HOT_LIMIT = 32
_CACHE_KIB = -65_536  # SQLite's page cache, negative: in KiB


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


class Store:
    """An open store; use `open_store`. Methods are safe to call from many tasks."""

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: Path,
        writer: BatchWriter,
        hot_limit: int,
        arrivals: Arrivals,
        identity: RunIdentity | None = None,
    ) -> None:
        self._conn = conn
        self._arrivals = arrivals
        self._path = path
        self._writer = writer
        self._limit = hot_limit
        self._identity = identity
        self._authority = Authority()
        self._hot: dict[str, Hot] = {}
        self._packer = RecordPacker()
        self._resume = Resume(conn, path, writer)

    # -- introspection -------------------------------------------------------------------

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

    def agents(self) -> tuple[str, ...]:
        """The agents whose state is in memory, sorted."""
        return tuple(sorted(self._hot))

    @property
    def hot_limit(self) -> int:
        """Newest items kept in memory per agent and category: what a working memory can use."""
        return self._limit

    def world_value(self, agent_id: str, key: str) -> str | None:
        """The value of one of the agent's world-state entries, from memory (no state built)."""
        entry = self._hot_for(agent_id).world.get(key)
        return None if entry is None else entry.value

    def state(self, agent_id: str) -> NpcState:
        """The agent's own bounded hot state, from memory; built once per change.

        Its episodic memory here is what is the agent's alone (what it was given, what
        reached its inbox); what it heard at its place is the place's log, which the shard
        merges in (sim.shard, shared perception).
        """
        return self._hot_for(agent_id).state()

    # -- loading and creating --------------------------------------------------------------

    async def load_agents(self, agent_ids: Iterable[str]) -> tuple[str, ...]:
        """Load hot state for many agents in seven queries; returns the ids not on disk.

        Agents already in memory are left as they are: their hot state is newer than
        anything the writer has not yet run.
        """
        wanted = sorted({a for a in agent_ids if a not in self._hot})
        if not wanted:
            return ()
        try:
            loaded = await load_hot(self._conn, wanted, self._limit)
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: loading {len(wanted)} agents failed: {exc}") from exc
        for agent, hot in loaded.items():
            self._hot.setdefault(agent, hot)
        return tuple(a for a in wanted if a not in loaded)

    async def ensure_agent(self, state: NpcState, *, writer: Writer) -> bool:
        """Create the agent from `state` unless it exists (in memory or on disk).

        Returns True when it was created. An existing agent is left as it is, even when
        `state` differs: the store, not the scenario file, is the agent's history.
        """
        agent_id = state.agent_id
        self._authority.check(agent_id, "agent", writer)
        if agent_id in self._hot:
            return False
        await self.load_agents([agent_id])
        if agent_id in self._hot:
            return False
        rows: dict[RowKind, list[tuple[Any, ...]]] = {}
        self._create(state, writer, rows)
        for kind, group in rows.items():
            await self._writer.put_rows(kind, group)
        return True

    async def ensure_agents(self, states: Iterable[NpcState], *, writer: Writer) -> int:
        """Create, in one transaction, every agent of `states` that exists neither in memory nor on disk.

        The bulk form of `ensure_agent` for start-up: one `load_agents` (seven queries) for the
        whole batch, the rows of the new agents queued, then one commit. The caller bounds the
        batch (a chunk of a few thousand agents), so the number of database round trips grows
        with the number of chunks, not of agents. Returns how many agents were created.
        """
        self._authority.check("(bulk)", "agent", writer)
        wanted = {state.agent_id: state for state in states if state.agent_id not in self._hot}
        if not wanted:
            return 0
        missing = await self.load_agents(wanted)
        rows: dict[RowKind, list[tuple[Any, ...]]] = {}
        for agent_id in missing:
            self._create(wanted[agent_id], writer, rows)
        for kind, group in rows.items():
            await self._writer.put_rows(kind, group)
        await self._writer.commit(None)
        return len(missing)

    def _create(self, state: NpcState, writer: Writer, rows: dict[RowKind, list[tuple[Any, ...]]]) -> None:
        """Put a new agent in memory and add its rows to `rows` (the caller checked it is new)."""
        agent_id = state.agent_id
        hot = self._hot[agent_id] = Hot.created(state, self._limit)
        w = writer.value
        rows.setdefault("agent", []).append((agent_id, state.system_prompt))
        rows.setdefault("fact", []).extend((agent_id, f.id, f.text, w) for f in hot.facts.values())
        rows.setdefault("world", []).extend((agent_id, wf.key, wf.value, w) for wf in hot.world.values())
        rows.setdefault("episode", []).extend((agent_id, e.tick, episode_item(e)) for e in state.episodic)
        rows.setdefault("belief", []).extend((agent_id, b.id, b.tick, b.text, b.confidence) for b in state.beliefs)
        rows.setdefault("line", []).extend(
            (agent_id, line.tick, line.seq, line.speaker, line.text) for line in state.dialogue
        )

    # -- writes ----------------------------------------------------------------------------

    async def add_fact(self, agent_id: str, fact: Fact, *, writer: Writer) -> None:
        """Add a canonical fact; the same fact again is a no-op, another text an error."""
        self._authority.check(agent_id, "canonical_facts", writer)
        hot = self._hot_for(agent_id)
        existing = hot.facts.get(fact.id)
        if existing is not None:
            if existing.text == fact.text:
                return
            self._authority.refuse(
                agent_id,
                "canonical_facts",
                writer,
                f"fact {fact.id!r} exists with text {existing.text!r}; canonical facts are add-only",
            )
        hot.add_fact(fact)
        await self._writer.put("fact", (agent_id, fact.id, fact.text, writer.value))

    async def set_world(self, agent_id: str, entry: WorldFact, *, writer: Writer) -> None:
        """Set a world-state entry (game system only)."""
        self._authority.check(agent_id, "world_state", writer)
        self._hot_for(agent_id).set_world(entry)
        await self._writer.put("world", (agent_id, entry.key, entry.value, writer.value))

    async def add_episode(self, agent_id: str, episode: Episode, *, writer: Writer) -> None:
        self._authority.check(agent_id, "episodic", writer)
        self._hot_for(agent_id).add_episode(episode)
        await self._writer.put("episode", (agent_id, episode.tick, episode_item(episode)))

    async def add_belief(self, agent_id: str, belief: Belief, *, writer: Writer) -> None:
        self._authority.check(agent_id, "beliefs", writer)
        self._hot_for(agent_id).add_belief(belief)
        await self._writer.put("belief", (agent_id, belief.id, belief.tick, belief.text, belief.confidence))

    async def add_line(self, agent_id: str, line: Line, *, writer: Writer) -> None:
        self._authority.check(agent_id, "dialogue", writer)
        self._hot_for(agent_id).add_line(line)
        await self._writer.put("line", (agent_id, line.tick, line.seq, line.speaker, line.text))

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
            return await load_place_log(self._conn)
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: loading the places' logs failed: {exc}") from exc

    async def record(self, record: AuditRecord) -> None:
        """Queue one audit record; the first record of an inference id wins."""
        blob, items = self._packer.pack(record)
        await self._writer.put("audit", (*(getattr(record, name) for name in COLUMNS), blob, items))

    # -- resume metadata -------------------------------------------------------------------

    async def record_input(self, tick: int, seq: int, player: str, agent: str, text: str) -> None:
        """Queue one outside input as taking effect at `tick` (committed with that tick)."""
        await self._resume.record_input(tick, seq, player, agent, text)

    async def record_world(self, tick: int, state: dict[str, str]) -> None:
        """Queue the world-state change that took effect at `tick` (committed with that tick)."""
        await self._resume.record_world(tick, state)

    async def inputs(self, tick: int) -> list[tuple[int, str, str, str]]:
        """The committed outside inputs of `tick`: (seq, player, agent, text) in seq order."""
        return await self._resume.inputs(tick)

    async def keep_sent(self, messages: list[tuple[int, str, bytes]]) -> None:
        """Queue what the shard keeps for re-sending, as (tick, topic, payload), replacing the last."""
        await self._resume.keep_sent(messages)

    async def sent(self) -> list[tuple[int, str, bytes]]:
        """What the shard kept for re-sending at its last commit: (tick, topic, payload)."""
        return await self._resume.sent()

    async def keep_identity(self, identity: RunIdentity, scenario: bytes | None = None) -> None:
        """Record the run this store belongs to, and the bytes of its scenario when given,
        committed at once (with what was queued before)."""
        await self._writer.put("run", (encode_identity(identity),))
        if scenario is not None:
            await self._writer.put("scenario", (identity.scenario_sha256, scenario))
        await self._writer.commit(None)
        self._identity = identity

    async def keep_says(self, says: list[tuple[str, bytes]]) -> None:
        """Queue the `say` messages (topic, payload) not yet acknowledged by the broker, replacing
        the last: committed with the tick, sent again by a resumed shard."""
        await self._resume.keep_says(says)

    async def says(self) -> list[tuple[str, bytes]]:
        """The `say` messages unacknowledged when the last tick committed."""
        return await self._resume.says()

    async def keep_pending(self, pending: Pending) -> None:
        """Queue what waits for the next tick (inbox mail, world-state changes), replacing the last."""
        await self._resume.keep_pending(pending)

    async def pending(self) -> Pending:
        """What waited for the tick after the last commit."""
        return await self._resume.pending()

    # -- commits ---------------------------------------------------------------------------

    def arrive(self, arrival: Arrival) -> None:
        """Journal an outside input as it arrives, with the tick that takes it (sim.store._arrivals):
        on disk for the kernel when this returns, kept until that tick commits."""
        self._arrivals.add(arrival)

    async def sync_arrivals(self) -> None:
        """Flush the journaled arrivals to the disk (before a tick that takes them commits), in
        a thread: an fdatasync takes milliseconds (2.5 ms on the development machine)."""
        await asyncio.to_thread(self._arrivals.sync)

    @property
    def pending_arrivals(self) -> list[Arrival]:
        """What arrived, as the store was opened, for ticks not committed: a resume takes it then."""
        return list(self._arrivals.pending)

    async def end_tick(self, tick: int) -> None:
        """Commit everything queued so far as tick `tick`; returns once it is on disk."""
        await (await self.queue_end_tick(tick))

    async def queue_end_tick(self, tick: int) -> asyncio.Future[None]:
        """Queue the commit of everything queued so far as tick `tick`; the future is done once
        it is on disk (await it), and what is queued meanwhile belongs to the next tick. So
        the next tick's work goes on while SQLite writes this one."""
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

    def _hot_for(self, agent_id: str) -> Hot:
        hot = self._hot.get(agent_id)
        if hot is None:
            raise StoreError(f"{self._path}: agent {agent_id!r} is not loaded: call ensure_agent or load_agents first")
        return hot


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
        last_tick, agent_keys, identity = await _prepare(conn, p)
        writer = BatchWriter(conn, p, Addresser(agent_keys), last_tick=last_tick, keep_tail=keep_tail)
        arrivals = Arrivals(p, last_tick)
        store = Store(conn, p, writer, hot_limit, arrivals, identity)
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


async def _prepare(
    conn: aiosqlite.Connection, path: Path
) -> tuple[int | None, dict[str, int], RunIdentity | None]:
    """Refuse foreign databases and other schema versions, switch to WAL, create the schema
    in a new file; the last committed tick, the agents' integer keys and the run the store
    belongs to."""
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
            await conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            await conn.execute("COMMIT")
        last_tick = await read_last_tick(conn)
        async with conn.execute(SELECT_AGENT_KEYS) as cursor:
            agent_keys = {str(agent): int(n) for agent, n in await cursor.fetchall()}
        async with conn.execute(SELECT_RUN) as cursor:
            row = await cursor.fetchone()
    except sqlite3.DatabaseError as exc:
        raise SchemaError(f"{path}: cannot use the database: {exc}") from exc
    return last_tick, agent_keys, None if row is None else _identity(path, row[0])


def _identity(path: Path, text: str) -> RunIdentity:
    try:
        return decode_identity(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SchemaError(f"{path}: the run identity it holds is unreadable: {exc}") from exc


async def _scalar(conn: aiosqlite.Connection, sql: str) -> int:
    async with conn.execute(sql) as cursor:
        row = await cursor.fetchone()
    return 0 if row is None else int(row[0])
