"""The aiosqlite store: bounded hot state in memory, one batching writer task, authority.

Every write updates the agent's hot state at once (so `state()` never queries) and puts
one row on a bounded queue. One writer task drains the queue, groups rows by statement and
runs each group with `executemany` inside one open transaction; `end_tick` commits it and
records the tick in `meta`, so a tick is either wholly on disk or not at all. Thousands of
agents writing at once never wait on one another's commits, only (when the queue is full)
on the writer: that is the backpressure.

Authority is enforced here, not by convention (DESIGN.md, "The state model"):

| category | who may write |
|---|---|
| canonical facts | SCENARIO, GAME; add-only, same id with other text refused |
| world state | GAME (SCENARIO only when creating the agent) |
| episodic, beliefs, dialogue | NPC (SCENARIO/GAME only when creating the agent) |

Episodes, beliefs and dialogue are append-only logs: an item is never changed in place, a
revised belief is a newer belief. Redelivered events are kept out by `mark_event`.

Each thing is stored once (schema 2, `sim.store._records`): an episode is an item
addressed by its content digest, and what an agent perceived in a tick is one `heard` row
listing the keys; an audit record references its state items and config by key and
stores the rest compressed. The writer task does the content addressing, so producers
only queue.

With `keep_tail=False` (the runner) closing the store rolls back whatever was queued after
the last `end_tick`: after a crash, however it happened, nothing of an unfinished tick is
on disk. What the shard sent in its last two committed ticks (`keep_sent`) and the outside
inputs (`record_input`) are committed with the tick, for an exact resume.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import msgspec

from sim.audit import AuditRecord
from sim.errors import AuthorityError, SchemaError, StoreError
from sim.memory import Belief, Episode, Fact, Line, NpcState, WorldFact, belief_order, episode_order, line_order
from sim.store._records import COLUMNS, Item, RecordPacker, item, pack_keys, unpack_keys
from sim.store._retention import PRUNE_SQL
from sim.store._schema import MIGRATIONS, SCHEMA_VERSION, check_file, check_version

__all__ = ["HOT_LIMIT", "Store", "StoreStatistics", "Writer", "open_store"]

log = logging.getLogger(__name__)

# Newest items kept in memory per agent and category: at least the largest default count
# cap (10 dialogue lines), with room for configs that raise the caps.
HOT_LIMIT = 32
_QUEUE_SIZE = 65_536
_BATCH_ROWS = 8_192
# Item keys the writer remembers as written (with their check); past this many it forgets
# them all and lets the database's collision trigger check the next ones.
_ITEM_CACHE = 1 << 18
_CACHE_KIB = -65_536  # SQLite's page cache, negative: in KiB

T = TypeVar("T")


class Writer(enum.Enum):
    """Who is writing: the authority a write is checked against."""

    SCENARIO = "scenario"
    GAME = "game"
    NPC = "npc"


_CREATORS = frozenset({Writer.SCENARIO, Writer.GAME})
_FACT_WRITERS = frozenset({Writer.SCENARIO, Writer.GAME})
_WORLD_WRITERS = frozenset({Writer.GAME})
_NPC_WRITERS = frozenset({Writer.NPC})


class StoreStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters since the store was opened."""

    rows_queued: int
    rows_written: int
    rows_dropped: int  # queued after the writer failed, never written
    batches: int
    commits: int
    last_tick: int | None
    authority_violations: int
    duplicate_events: int
    hot_agents: int
    queue_size: int
    queue_high_water: int
    rows_pruned: int = 0


# Statements by row kind, in the order a batch runs them.
_SQL: dict[str, str] = {
    "agent": "INSERT OR IGNORE INTO agents (agent, system_prompt) VALUES (?, ?)",
    "fact": "INSERT OR IGNORE INTO facts (agent, id, text, writer) VALUES (?, ?, ?, ?)",
    "world": "INSERT INTO world (agent, key, value, writer) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (agent, key) DO UPDATE SET value = excluded.value, writer = excluded.writer",
    "agent_key": "INSERT INTO agent_keys (n, agent) VALUES (?, ?)",
    "item": "INSERT OR IGNORE INTO items (k, body) VALUES (?, ?)",
    "heard": "INSERT INTO heard (agent, tick, items) VALUES (?, ?, ?)",
    "belief": "INSERT INTO beliefs (agent, id, tick, text, confidence) VALUES (?, ?, ?, ?, ?)",
    "line": "INSERT INTO dialogue (agent, tick, seq, speaker, text) VALUES (?, ?, ?, ?, ?)",
    "event": "INSERT OR IGNORE INTO events (id) VALUES (?)",
    "audit": "INSERT OR IGNORE INTO audit (id, run_id, agent, tick, backend, model, fallback, line, record, format)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 2)",
    "input": "INSERT OR REPLACE INTO inputs (tick, seq, player, agent, text) VALUES (?, ?, ?, ?, ?)",
    "meta": "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
}
_EPISODE_DECODER = msgspec.msgpack.Decoder(Episode)
_ENCODER = msgspec.msgpack.Encoder()

_sent_encoder = msgspec.msgpack.Encoder()
_sent_decoder = msgspec.msgpack.Decoder(list[tuple[int, str, bytes]])

# Newest `limit` rows per agent for the agents in a JSON array, oldest first: the same
# total order as NpcState's (tick, id, ...), so hot state is exactly the newest N. The
# correlated LIMIT walks each agent's recency index backwards and stops after N rows, so
# the cost follows the agents loaded, not the length of their history.
_IDS = "agent IN (SELECT value FROM json_each(?))"


def _recent(table: str, columns: str, order: str) -> str:
    newest_first = ", ".join(f"{c} DESC" for c in order.split(", "))
    return (
        f"SELECT t.agent, {', '.join('t.' + c for c in columns.split(', '))} FROM json_each(?) AS j"
        f" JOIN {table} AS t ON t.n IN (SELECT n FROM {table} WHERE agent = j.value"
        f" ORDER BY {newest_first} LIMIT ?) ORDER BY t.agent, {', '.join('t.' + c for c in order.split(', '))}"
    )


# Heard rows hold several items each, so the newest `limit` rows by tick hold at least
# `limit` items; every row of the boundary tick is taken too, and Python keeps the newest
# `limit` items by (tick, id).
_HEARD_RECENT = (
    "SELECT a.agent, h.items FROM json_each(?) AS j JOIN agent_keys AS a ON a.agent = j.value"
    " JOIN heard AS h ON h.agent = a.n AND h.tick >= IFNULL((SELECT tick FROM heard WHERE agent = a.n"
    " ORDER BY tick DESC LIMIT 1 OFFSET ?), -1)"
)
_ITEM_BODIES = "SELECT k, body FROM items WHERE k IN (SELECT value FROM json_each(?))"

_RECENT: dict[str, str] = {
    "episodic": _recent("episodes", "id, tick, text, significance", "tick, id, text, significance"),
    "beliefs": _recent("beliefs", "id, tick, text, confidence", "tick, id, text, confidence"),
    "dialogue": _recent("dialogue", "tick, seq, speaker, text", "tick, seq, speaker, text"),
}


def _insert_bounded(items: list[T], item: T, key: Callable[[T], Any], limit: int) -> None:
    """Insert in recency order and keep only the newest `limit` items."""
    k = key(item)
    if len(items) >= limit and k <= key(items[0]):
        return
    bisect.insort(items, item, key=key)
    if len(items) > limit:
        del items[0]


class _Hot:
    """One agent's in-memory state: all facts and world state, newest N of the rest."""

    __slots__ = ("beliefs", "dialogue", "episodic", "facts", "state", "system_prompt", "world")

    def __init__(self, system_prompt: str) -> None:
        self.system_prompt = system_prompt
        self.facts: dict[str, Fact] = {}
        self.world: dict[str, WorldFact] = {}
        self.episodic: list[Episode] = []
        self.beliefs: list[Belief] = []
        self.dialogue: list[Line] = []
        self.state: NpcState | None = None


class _Commit:
    __slots__ = ("future", "tick")

    def __init__(self, tick: int | None, future: asyncio.Future[None]) -> None:
        self.tick = tick
        self.future = future


class _Prune:
    __slots__ = ("future", "keep")

    def __init__(self, keep: int, future: asyncio.Future[int]) -> None:
        self.keep = keep
        self.future = future


_CLOSE = object()


class Store:
    """An open store; use `open_store`. Methods are safe to call from many tasks."""

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: Path,
        last_tick: int | None,
        hot_limit: int,
        agent_keys: dict[str, int],
        *,
        keep_tail: bool = True,
    ) -> None:
        self._conn = conn
        self._keep_tail = keep_tail
        self._agent_keys = agent_keys
        self._item_checks: dict[int, int] = {}
        self._packer = RecordPacker()
        self._path = path
        self._limit = hot_limit
        self._hot: dict[str, _Hot] = {}
        self._queue: asyncio.Queue[Any] = asyncio.Queue(_QUEUE_SIZE)
        self._pending_events: set[str] = set()
        self._failure: StoreError | None = None
        self._closing = False
        self._in_transaction = False
        self._writer_done = asyncio.Event()
        self._last_tick = last_tick
        self._rows_queued = 0
        self._rows_written = 0
        self._rows_dropped = 0
        self._batches = 0
        self._commits = 0
        self._violations = 0
        self._duplicates = 0
        self._high_water = 0
        self._pruned = 0

    # -- introspection -------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def last_tick(self) -> int | None:
        """The last tick committed with `end_tick` (also across restarts), for --resume."""
        return self._last_tick

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            rows_queued=self._rows_queued,
            rows_written=self._rows_written,
            rows_dropped=self._rows_dropped,
            batches=self._batches,
            commits=self._commits,
            last_tick=self._last_tick,
            authority_violations=self._violations,
            duplicate_events=self._duplicates,
            hot_agents=len(self._hot),
            queue_size=self._queue.qsize(),
            queue_high_water=self._high_water,
            rows_pruned=self._pruned,
        )

    def agents(self) -> tuple[str, ...]:
        """The agents whose state is in memory, sorted."""
        return tuple(sorted(self._hot))

    def state(self, agent_id: str) -> NpcState:
        """The agent's bounded hot state, from memory; built once per change."""
        hot = self._hot_for(agent_id)
        if hot.state is None:
            hot.state = NpcState(
                agent_id=agent_id,
                system_prompt=hot.system_prompt,
                canonical_facts=tuple(hot.facts.values()),
                world_state=tuple(hot.world.values()),
                episodic=tuple(hot.episodic),
                beliefs=tuple(hot.beliefs),
                dialogue=tuple(hot.dialogue),
            )
        return hot.state

    # -- loading -------------------------------------------------------------------------

    async def load_agents(self, agent_ids: Iterable[str]) -> tuple[str, ...]:
        """Load hot state for many agents in eight queries; returns the ids not on disk.

        Agents already in memory are left as they are: their hot state is newer than
        anything the writer has not yet run.
        """
        wanted = sorted({a for a in agent_ids if a not in self._hot})
        if not wanted:
            return ()
        ids = json.dumps(wanted)
        try:
            prompts = await self._fetch("SELECT agent, system_prompt FROM agents WHERE " + _IDS, (ids,))
            facts = await self._fetch("SELECT agent, id, text FROM facts WHERE " + _IDS, (ids,))
            world = await self._fetch("SELECT agent, key, value FROM world WHERE " + _IDS, (ids,))
            episodic = await self._fetch(_RECENT["episodic"], (ids, self._limit))
            heard = await self._heard(ids)
            beliefs = await self._fetch(_RECENT["beliefs"], (ids, self._limit))
            dialogue = await self._fetch(_RECENT["dialogue"], (ids, self._limit))
        except sqlite3.Error as exc:
            raise StoreError(f"{self._path}: loading {len(wanted)} agents failed: {exc}") from exc
        loaded: dict[str, _Hot] = {agent: _Hot(prompt) for agent, prompt in prompts}
        for agent, fid, text in facts:
            loaded[agent].facts[fid] = Fact(id=fid, text=text)
        for agent, key, value in world:
            loaded[agent].world[key] = WorldFact(key=key, value=value)
        for agent, eid, tick, text, significance in episodic:
            loaded[agent].episodic.append(Episode(id=eid, tick=tick, text=text, significance=significance))
        for agent, episodes in heard.items():
            merged = loaded[agent].episodic + episodes
            merged.sort(key=episode_order)
            loaded[agent].episodic = merged[-self._limit :]
        for agent, bid, tick, text, confidence in beliefs:
            loaded[agent].beliefs.append(Belief(id=bid, tick=tick, text=text, confidence=confidence))
        for agent, tick, seq, speaker, text in dialogue:
            loaded[agent].dialogue.append(Line(tick=tick, seq=seq, speaker=speaker, text=text))
        for agent, hot in loaded.items():
            self._hot.setdefault(agent, hot)
        return tuple(a for a in wanted if a not in loaded)

    async def _heard(self, ids: str) -> dict[str, list[Episode]]:
        """Each agent's newest episodes from `heard` (a superset of the newest N)."""
        rows = await self._fetch(_HEARD_RECENT, (ids, self._limit - 1))
        keys: dict[str, list[int]] = {}
        for agent, blob in rows:
            keys.setdefault(agent, []).extend(unpack_keys(blob))
        wanted = sorted({k for ks in keys.values() for k in ks})
        bodies: dict[int, bytes] = {}
        for start in range(0, len(wanted), 100_000):
            chunk = json.dumps(wanted[start : start + 100_000])
            bodies.update(await self._fetch(_ITEM_BODIES, (chunk,)))  # type: ignore[arg-type]
        return {agent: [_EPISODE_DECODER.decode(bodies[k]) for k in ks] for agent, ks in keys.items()}

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> Iterable[sqlite3.Row]:
        async with self._conn.execute(sql, params) as cursor:
            return await cursor.fetchall()

    async def ensure_agent(self, state: NpcState, *, writer: Writer) -> bool:
        """Create the agent from `state` unless it exists (in memory or on disk).

        Returns True when it was created. An existing agent is left as it is, even when
        `state` differs: the store, not the scenario file, is the agent's history.
        """
        agent_id = state.agent_id
        if writer not in _CREATORS:
            self._violation(agent_id, "agent", writer)
        if agent_id in self._hot:
            return False
        await self.load_agents([agent_id])
        if agent_id in self._hot:
            return False
        await self._create(state, writer)
        return True

    async def ensure_agents(self, states: Iterable[NpcState], *, writer: Writer) -> int:
        """Create, in one transaction, every agent of `states` that exists neither in memory nor on disk.

        The bulk form of `ensure_agent` for start-up: one `load_agents` (six queries) for the
        whole batch, the rows of the new agents queued, then one commit. The caller bounds the
        batch (a chunk of a few thousand agents), so the number of database round trips grows
        with the number of chunks, not of agents. Returns how many agents were created.
        """
        if writer not in _CREATORS:
            self._violation("(bulk)", "agent", writer)
        wanted = {state.agent_id: state for state in states if state.agent_id not in self._hot}
        if not wanted:
            return 0
        missing = await self.load_agents(wanted)
        for agent_id in missing:
            await self._create(wanted[agent_id], writer)
        await self._commit(None)
        return len(missing)

    async def _create(self, state: NpcState, writer: Writer) -> None:
        """Put a new agent in memory and queue its rows (the caller checked it is new)."""
        agent_id = state.agent_id
        hot = _Hot(state.system_prompt)
        hot.facts = {f.id: f for f in state.canonical_facts}
        hot.world = {w.key: w for w in state.world_state}
        hot.episodic = list(state.episodic[-self._limit :])
        hot.beliefs = list(state.beliefs[-self._limit :])
        hot.dialogue = list(state.dialogue[-self._limit :])
        self._hot[agent_id] = hot
        w = writer.value
        await self._put("agent", (agent_id, state.system_prompt))
        for f in hot.facts.values():
            await self._put("fact", (agent_id, f.id, f.text, w))
        for wf in hot.world.values():
            await self._put("world", (agent_id, wf.key, wf.value, w))
        for e in state.episodic:
            await self._put("episode", (agent_id, e.tick, item(_ENCODER.encode(e))))
        for b in state.beliefs:
            await self._put("belief", (agent_id, b.id, b.tick, b.text, b.confidence))
        for line in state.dialogue:
            await self._put("line", (agent_id, line.tick, line.seq, line.speaker, line.text))

    # -- writes --------------------------------------------------------------------------

    async def add_fact(self, agent_id: str, fact: Fact, *, writer: Writer) -> None:
        """Add a canonical fact; the same fact again is a no-op, another text an error."""
        if writer not in _FACT_WRITERS:
            self._violation(agent_id, "canonical_facts", writer)
        hot = self._hot_for(agent_id)
        existing = hot.facts.get(fact.id)
        if existing is not None:
            if existing.text == fact.text:
                return
            self._violation(
                agent_id,
                "canonical_facts",
                writer,
                f"fact {fact.id!r} exists with text {existing.text!r}; canonical facts are add-only",
            )
        hot.facts[fact.id] = fact
        hot.state = None
        await self._put("fact", (agent_id, fact.id, fact.text, writer.value))

    async def set_world(self, agent_id: str, entry: WorldFact, *, writer: Writer) -> None:
        """Set a world-state entry (game system only)."""
        if writer not in _WORLD_WRITERS:
            self._violation(agent_id, "world_state", writer)
        hot = self._hot_for(agent_id)
        hot.world[entry.key] = entry
        hot.state = None
        await self._put("world", (agent_id, entry.key, entry.value, writer.value))

    async def add_episode(self, agent_id: str, episode: Episode, *, writer: Writer) -> None:
        if writer not in _NPC_WRITERS:
            self._violation(agent_id, "episodic", writer)
        hot = self._hot_for(agent_id)
        _insert_bounded(hot.episodic, episode, episode_order, self._limit)
        hot.state = None
        await self._put("episode", (agent_id, episode.tick, item(_ENCODER.encode(episode))))

    async def add_belief(self, agent_id: str, belief: Belief, *, writer: Writer) -> None:
        if writer not in _NPC_WRITERS:
            self._violation(agent_id, "beliefs", writer)
        hot = self._hot_for(agent_id)
        _insert_bounded(hot.beliefs, belief, belief_order, self._limit)
        hot.state = None
        await self._put("belief", (agent_id, belief.id, belief.tick, belief.text, belief.confidence))

    async def add_line(self, agent_id: str, line: Line, *, writer: Writer) -> None:
        if writer not in _NPC_WRITERS:
            self._violation(agent_id, "dialogue", writer)
        hot = self._hot_for(agent_id)
        _insert_bounded(hot.dialogue, line, line_order, self._limit)
        hot.state = None
        await self._put("line", (agent_id, line.tick, line.seq, line.speaker, line.text))

    async def mark_event(self, event_id: str) -> bool:
        """Claim an event id; False when it was applied before (a redelivery)."""
        if event_id in self._pending_events:
            self._duplicates += 1
            return False
        self._pending_events.add(event_id)
        try:
            rows = await self._fetch("SELECT 1 FROM events WHERE id = ?", (event_id,))
        except sqlite3.Error as exc:
            self._pending_events.discard(event_id)
            raise StoreError(f"{self._path}: looking up event {event_id!r} failed: {exc}") from exc
        if rows:
            self._pending_events.discard(event_id)
            self._duplicates += 1
            return False
        await self._put("event", (event_id,))
        return True

    async def record(self, record: AuditRecord) -> None:
        """Queue one audit record; the first record of an inference id wins."""
        blob, items = self._packer.pack(record)
        await self._put("audit", (*(getattr(record, name) for name in COLUMNS), blob, items))

    async def record_input(self, tick: int, seq: int, player: str, agent: str, text: str) -> None:
        """Queue one outside input as taking effect at `tick` (committed with that tick)."""
        await self._put("input", (tick, seq, player, agent, text))

    async def inputs(self, tick: int) -> list[tuple[int, str, str, str]]:
        """The committed outside inputs of `tick`: (seq, player, agent, text) in seq order."""
        rows = await self._fetch("SELECT seq, player, agent, text FROM inputs WHERE tick = ? ORDER BY seq", (tick,))
        return [(int(seq), str(p), str(a), str(t)) for seq, p, a, t in rows]

    async def keep_sent(self, messages: list[tuple[int, str, bytes]]) -> None:
        """Queue what the shard keeps for re-sending, as (tick, topic, payload), replacing the last."""
        await self._put("meta", ("sent", _sent_encoder.encode(messages)))

    async def sent(self) -> list[tuple[int, str, bytes]]:
        """What the shard kept for re-sending at its last commit: (tick, topic, payload)."""
        rows = list(await self._fetch("SELECT value FROM meta WHERE key = 'sent'", ()))
        if not rows:
            return []
        try:
            return _sent_decoder.decode(rows[0][0])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{self._path}: the kept messages of the last tick are unreadable: {exc}") from exc

    async def end_tick(self, tick: int) -> None:
        """Commit everything queued so far as tick `tick`; returns once it is on disk."""
        if self._last_tick is not None and tick < self._last_tick:
            raise StoreError(f"{self._path}: end_tick({tick}) after tick {self._last_tick} was committed")
        await self._commit(tick)

    async def flush(self) -> None:
        """Commit everything queued so far without ending a tick."""
        await self._commit(None)

    async def prune_memories(self, keep: int) -> int:
        """Delete memories older than each agent's newest `keep` per category; rows deleted.

        `keep` below the hot limit is refused: what a working memory can use is never
        pruned, and neither is anything an audit record references (sim/store/_retention.py).
        The deletion is committed with the next commit.
        """
        if keep < self._limit:
            raise StoreError(f"{self._path}: keeping {keep} memories per category is below the hot limit {self._limit}")
        self._check_open()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Prune(keep, future))
        return await future

    # -- internals -----------------------------------------------------------------------

    def _hot_for(self, agent_id: str) -> _Hot:
        hot = self._hot.get(agent_id)
        if hot is None:
            raise StoreError(f"{self._path}: agent {agent_id!r} is not loaded: call ensure_agent or load_agents first")
        return hot

    def _violation(self, agent_id: str, category: str, writer: Writer, why: str = "") -> None:
        self._violations += 1
        message = f"agent {agent_id!r}: writer {writer.name} may not write {category}"
        if why:
            message = f"agent {agent_id!r}: writer {writer.name} may not write {category}: {why}"
        log.warning("authority violation #%d: %s", self._violations, message)
        raise AuthorityError(message)

    def _check_open(self) -> None:
        if self._failure is not None:
            raise StoreError(f"{self._path}: the store's writer failed: {self._failure}") from self._failure
        if self._closing:
            raise StoreError(f"{self._path}: the store is closed")

    async def _put(self, kind: str, row: tuple[Any, ...]) -> None:
        self._check_open()
        self._rows_queued += 1
        await self._queue.put((kind, row))
        size = self._queue.qsize()
        if size > self._high_water:
            self._high_water = size

    async def _commit(self, tick: int | None) -> None:
        self._check_open()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Commit(tick, future))
        await future

    async def _close(self) -> None:
        """Flush and commit what is queued, then stop the writer."""
        if self._closing:
            return
        self._closing = True
        if not self._writer_done.is_set():
            await self._queue.put(_CLOSE)
            await self._writer_done.wait()

    async def _run_writer(self) -> None:
        """Drain the queue in batches until closed; on a database error, fail loudly.

        After a failure the loop keeps draining (dropping and counting rows, failing
        commit waiters) so producers blocked on the full queue are released.
        """
        rows: dict[str, list[tuple[Any, ...]]] = {}
        events: list[str] = []
        closing = False
        try:
            while True:
                batch = [await self._queue.get()]
                while len(batch) < _BATCH_ROWS:
                    try:
                        batch.append(self._queue.get_nowait())
                    except asyncio.QueueEmpty:
                        break
                for op in batch:
                    if isinstance(op, tuple):
                        rows.setdefault(op[0], []).append(op[1])
                        if op[0] == "event":
                            events.append(op[1][0])
                    elif isinstance(op, _Commit):
                        await self._write(rows, events, commit=True, tick=op.tick)
                        self._settle(op.future)
                    elif isinstance(op, _Prune):
                        await self._write(rows, events, commit=False, tick=None)
                        await self._prune(op)
                    else:
                        closing = True
                if closing and self._queue.empty():
                    if self._keep_tail:
                        await self._write(rows, events, commit=True, tick=None)
                    else:
                        await self._roll_back(rows)
                    return
                await self._write(rows, events, commit=False, tick=None)
        finally:
            self._writer_done.set()

    async def _write(
        self, rows: dict[str, list[tuple[Any, ...]]], events: list[str], *, commit: bool, tick: int | None
    ) -> None:
        """Run the collected rows in the open transaction; commit it when asked."""
        if self._failure is None:
            try:
                await self._execute(rows)
                if commit:
                    await self._commit_transaction(tick)
            except (sqlite3.Error, StoreError) as exc:
                self._fail(exc)
        self._drop(rows)
        if commit:
            self._pending_events.difference_update(events)
            events.clear()

    async def _roll_back(self, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        """Forget the unfinished tick: rows not yet run and the open transaction."""
        discarded = bool(rows) or self._in_transaction
        rows.clear()
        if self._in_transaction and self._failure is None:
            try:
                await self._conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                self._fail(exc)
            self._in_transaction = False
        if discarded:
            log.info("%s: rolled back the unfinished tick after %s", self._path, self._last_tick)

    async def _begin(self) -> None:
        if not self._in_transaction:
            await self._conn.execute("BEGIN")
            self._in_transaction = True

    async def _execute(self, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        if not rows:
            return
        self._address(rows)
        await self._begin()
        for kind, sql in _SQL.items():
            group = rows.pop(kind, None)
            if group:
                await self._conn.executemany(sql, group)
                self._rows_written += len(group)
        self._batches += 1

    async def _commit_transaction(self, tick: int | None) -> None:
        if tick is not None:
            await self._begin()
            await self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last_tick', ?)", (tick,))
        if self._in_transaction:
            await self._conn.execute("COMMIT")
            self._in_transaction = False
            self._commits += 1
        if tick is not None:
            self._last_tick = tick

    async def _prune(self, op: _Prune) -> None:
        deleted = 0
        if self._failure is None:
            try:
                await self._begin()
                for _, sql in PRUNE_SQL:
                    async with self._conn.execute(sql, (op.keep,)) as cursor:
                        deleted += max(cursor.rowcount, 0)
            except sqlite3.Error as exc:
                self._fail(exc)
        if op.future.done():
            return
        if self._failure is not None:
            op.future.set_exception(StoreError(f"{self._path}: pruning failed: {self._failure}"))
        else:
            self._pruned += deleted
            op.future.set_result(deleted)

    def _address(self, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        """Turn queued episodes and records into item, heard and audit rows: each item once.

        An agent's episodes of one tick in one batch become one `heard` row.
        """
        items: list[tuple[int, bytes]] = []
        checks = self._item_checks

        def add(it: Item) -> None:
            known = checks.get(it.key)
            if known is None:
                if len(checks) >= _ITEM_CACHE:
                    checks.clear()
                checks[it.key] = it.check
                items.append((it.key, it.body))
            elif known != it.check:
                raise StoreError(f"two different items with the digest key {it.key}; nothing of this batch is written")

        episodes = rows.pop("episode", None)
        if episodes:
            heard: dict[tuple[int, int], list[int]] = {}
            for agent, tick, it in episodes:
                add(it)
                heard.setdefault((self._agent_key(agent, rows), tick), []).append(it.key)
            rows["heard"] = [(agent_key, tick, pack_keys(keys)) for (agent_key, tick), keys in heard.items()]
        audits = rows.get("audit")
        if audits:
            for row in audits:
                for it in row[-1]:
                    add(it)
            rows["audit"] = [row[:-1] for row in audits]
        if items:
            rows.setdefault("item", []).extend(items)

    def _agent_key(self, agent: str, rows: dict[str, list[tuple[Any, ...]]]) -> int:
        """The agent's small integer key in `heard` rows, assigned on first use."""
        key = self._agent_keys.get(agent)
        if key is None:
            key = self._agent_keys[agent] = len(self._agent_keys) + 1
            rows.setdefault("agent_key", []).append((key, agent))
        return key

    def _settle(self, future: asyncio.Future[None]) -> None:
        if future.done():
            return
        if self._failure is not None:
            future.set_exception(StoreError(f"{self._path}: commit failed: {self._failure}"))
        else:
            future.set_result(None)

    def _fail(self, exc: sqlite3.Error | StoreError) -> None:
        self._failure = StoreError(f"{self._path}: write failed: {exc}")
        self._failure.__cause__ = exc
        log.error("store writer failed, further writes are refused: %s", self._failure)

    def _drop(self, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        """Count rows that could not be written (only after a failure)."""
        dropped = sum(len(group) for group in rows.values())
        if dropped:
            self._rows_dropped += dropped
            log.error("dropped %d rows after the writer failed (%d in total)", dropped, self._rows_dropped)
        rows.clear()


@asynccontextmanager
async def open_store(
    path: str | os.PathLike[str], *, hot_limit: int = HOT_LIMIT, create: bool = True, keep_tail: bool = True
) -> AsyncIterator[Store]:
    """Open (or create) a store file; on exit, flush and commit everything queued.

    The exit flushes whatever ended the block (normal end, an error, a cancellation from
    SIGTERM or Ctrl-C); only SIGKILL loses the uncommitted tail, never a committed tick.
    With `keep_tail=False` the exit rolls the uncommitted tail back instead: only whole
    ticks are ever on disk.
    """
    if hot_limit < 1:
        raise StoreError(f"hot_limit must be >= 1, got {hot_limit}")
    p = Path(path)
    check_file(p, must_exist=not create)
    try:
        conn = await aiosqlite.connect(p, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"{p}: cannot open the database: {exc}") from exc
    try:
        last_tick, agent_keys = await _prepare(conn, p)
        store = Store(conn, p, last_tick, hot_limit, agent_keys, keep_tail=keep_tail)
        error: BaseException | None = None
        async with asyncio.TaskGroup() as tg:
            tg.create_task(store._run_writer())
            try:
                yield store
            except BaseException as exc:  # noqa: BLE001 - re-raised below, unwrapped by the TaskGroup
                error = exc
            finally:
                await store._close()
        if error is not None:
            raise error
        if store._failure is not None:
            raise store._failure
    finally:
        await conn.close()


async def _prepare(conn: aiosqlite.Connection, path: Path) -> tuple[int | None, dict[str, int]]:
    """Refuse foreign or newer databases, switch to WAL, migrate; the last committed tick
    and the agents' integer keys."""
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
        for target in range(version + 1, SCHEMA_VERSION + 1):
            await conn.execute("BEGIN IMMEDIATE")
            for statement in MIGRATIONS[target - 1]:
                await conn.execute(statement)
            await conn.execute(f"PRAGMA user_version = {target}")
            await conn.execute("COMMIT")
            log.info("%s: migrated the schema to version %d", path, target)
        async with conn.execute("SELECT value FROM meta WHERE key = 'last_tick'") as cursor:
            row = await cursor.fetchone()
        async with conn.execute("SELECT agent, n FROM agent_keys") as cursor:
            agent_keys = {str(agent): int(n) for agent, n in await cursor.fetchall()}
    except sqlite3.DatabaseError as exc:
        raise SchemaError(f"{path}: cannot use the database: {exc}") from exc
    return (None if row is None else int(row[0])), agent_keys


async def _scalar(conn: aiosqlite.Connection, sql: str) -> int:
    async with conn.execute(sql) as cursor:
        row = await cursor.fetchone()
    return 0 if row is None else int(row[0])
