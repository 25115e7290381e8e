"""Each agent's state with authority: loaded or created, written, and kept in memory.

Every write is checked (`_authority`), updates the agent's hot state at once (so `state()`
never queries) and queues one row for the writer task. `Store` (sim.store._database) is this
with the run's parts beside it: its identity, the places' logs, the audit, the ticks.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import msgspec

from sim.errors import StoreError
from sim.memory import Belief, Episode, Fact, Line, NpcState, WorldFact
from sim.store._authority import Authority, Writer
from sim.store._hot import Hot, load_hot
from sim.store._items import episode_item
from sim.store._writer import BatchWriter
from sim.store.records import Item
from sim.store.sql import RowKind

__all__ = ["AgentStore"]

_ENCODER = msgspec.msgpack.Encoder()
_HEARD_CACHE = 200_000  # episodes whose items `add_heard` keeps made


class AgentStore:
    """The agents' state of an open store (the part of `Store` that holds agents)."""

    def __init__(self, conn: aiosqlite.Connection, path: Path, writer: BatchWriter, hot_limit: int) -> None:
        self._conn = conn
        self._path = path
        self._writer = writer
        self._limit = hot_limit
        self._authority = Authority()
        self._hot: dict[str, Hot] = {}
        self._heard_items: dict[int, tuple[Episode, Item]] = {}

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

    def fact_text(self, agent_id: str, fact_id: str) -> str | None:
        """The text of one of the agent's canonical facts, from memory (no state built)."""
        fact = self._hot_for(agent_id).facts.get(fact_id)
        return None if fact is None else fact.text

    def kept(self, agent_id: str) -> Sequence[Episode]:
        """The agent's kept episodes (`Hot.keep`), what its recall ranks; a view, not a copy."""
        return self._hot_for(agent_id).kept

    def state(self, agent_id: str) -> NpcState:
        """The agent's own bounded hot state, from memory; built once per change.

        Its episodic memory here is what is the agent's alone (what it was given, what
        reached its inbox); what it heard at its place is the place's log, which the shard
        merges in (sim.shard, shared perception).
        """
        return self._hot_for(agent_id).state()

    # -- loading and creating --------------------------------------------------------------

    async def load_agents(self, agent_ids: Iterable[str]) -> tuple[str, ...]:
        """Load hot state for many agents in eight queries; returns the ids not on disk.

        Agents already in memory are left as they are: their hot state is newer than
        anything the writer has not yet run.
        """
        wanted = sorted({a for a in agent_ids if a not in self._hot})
        if not wanted:
            return ()
        try:
            loaded = await load_hot(self._conn, wanted, self._limit, self._writer.sealer, str(self._path))
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

        The bulk form of `ensure_agent` for start-up: one `load_agents` (eight queries) for the
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
        rows.setdefault("fact", []).extend((agent_id, f.id, f.text, w, 0) for f in hot.facts.values())
        rows.setdefault("world", []).extend((agent_id, wf.key, wf.value, w) for wf in hot.world.values())
        rows.setdefault("episode", []).extend((agent_id, e.tick, episode_item(e)) for e in state.episodic)
        rows.setdefault("belief", []).extend((agent_id, b.id, b.tick, b.text, float(b.confidence))
                                             for b in state.beliefs)
        rows.setdefault("line", []).extend(
            _line_row(agent_id, line) for line in state.dialogue
        )
        for episode in state.episodic:
            slot = hot.keep(episode)
            if slot is not None:
                rows.setdefault("kept", []).append((agent_id, slot, _ENCODER.encode(episode)))

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
        await self._writer.put("fact", (agent_id, fact.id, fact.text, writer.value, 0))

    async def replace_fact(self, agent_id: str, fact: Fact, *, writer: Writer) -> None:
        """Give a fact the agent holds another text: the game's alone (the king comes back)."""
        hot = self._game_fact(agent_id, fact.id, writer, "replace")
        hot.add_fact(fact)
        await self._writer.put("fact", (agent_id, fact.id, fact.text, writer.value, 0))

    async def withdraw_fact(self, agent_id: str, fact_id: str, *, writer: Writer) -> None:
        """Withdraw a fact the agent holds: the game's alone; no later prompt holds it."""
        hot = self._game_fact(agent_id, fact_id, writer, "withdraw")
        hot.withdraw_fact(fact_id)
        await self._writer.put("fact", (agent_id, fact_id, "", writer.value, 1))

    def _game_fact(self, agent_id: str, fact_id: str, writer: Writer, act: str) -> Hot:
        """The agent's hot state, when `writer` is the game and the agent holds `fact_id`."""
        self._authority.check(agent_id, "canonical_facts", writer)
        if writer is not Writer.GAME:
            self._authority.refuse(agent_id, "canonical_facts", writer, f"only the game may {act} a fact")
        hot = self._hot_for(agent_id)
        if fact_id not in hot.facts:
            raise StoreError(f"agent {agent_id!r} holds no fact {fact_id!r} to {act}")
        return hot

    async def set_world(self, agent_id: str, entry: WorldFact, *, writer: Writer) -> None:
        """Set a world-state entry (game system only)."""
        self._authority.check(agent_id, "world_state", writer)
        self._hot_for(agent_id).set_world(entry)
        await self._writer.put("world", (agent_id, entry.key, entry.value, writer.value))

    async def add_episode(self, agent_id: str, episode: Episode, *, writer: Writer) -> None:
        """Add an episode to the agent's own memory (kept for recall too when significant)."""
        self._authority.check(agent_id, "episodic", writer)
        self._hot_for(agent_id).add_episode(episode)
        await self._writer.put("episode", (agent_id, episode.tick, episode_item(episode)))
        await self.keep(agent_id, episode, writer=writer)

    async def add_heard(self, agent_id: str, episodes: Sequence[Episode]) -> None:
        """What the agent heard at a place it left, into its own memory, as one batch (NPC
        authority). The place's log kept each addressed or significant one for recall already.
        An overheard event's episode is one object for all its listeners, who often leave
        together: its item is made once (cached by object, which the cache holds, so that
        no other object can take its id)."""
        self._authority.check(agent_id, "episodic", Writer.NPC)
        self._hot_for(agent_id).add_episodes(episodes)
        cache = self._heard_items
        if len(cache) > _HEARD_CACHE:
            cache.clear()
        rows = []
        for episode in episodes:
            cached = cache.get(id(episode))
            if cached is None or cached[0] is not episode:
                cached = cache[id(episode)] = (episode, episode_item(episode))
            rows.append((agent_id, episode.tick, cached[1]))
        await self._writer.put_rows("episode", rows)

    async def keep(self, agent_id: str, episode: Episode, *, writer: Writer) -> None:
        """Keep a significant episode for recall (`Hot.keep`): an episode of the agent's own,
        or the memory of a line said to it at its place (which its place's log holds)."""
        self._authority.check(agent_id, "episodic", writer)
        slot = self._hot_for(agent_id).keep(episode)
        if slot is not None:
            await self._writer.put("kept", (agent_id, slot, _ENCODER.encode(episode)))

    async def add_belief(self, agent_id: str, belief: Belief, *, writer: Writer) -> None:
        self._authority.check(agent_id, "beliefs", writer)
        self._hot_for(agent_id).add_belief(belief)
        # a float as SQLite gives it back (a REAL): its seal is the same
        await self._writer.put("belief", (agent_id, belief.id, belief.tick, belief.text, float(belief.confidence)))

    async def add_line(self, agent_id: str, line: Line, *, writer: Writer) -> None:
        self._authority.check(agent_id, "dialogue", writer)
        self._hot_for(agent_id).add_line(line)
        await self._writer.put("line", _line_row(agent_id, line))

    def _hot_for(self, agent_id: str) -> Hot:
        hot = self._hot.get(agent_id)
        if hot is None:
            raise StoreError(f"{self._path}: agent {agent_id!r} is not loaded: call ensure_agent or load_agents first")
        return hot


def _line_row(agent_id: str, line: Line) -> tuple[str, int, int, str, str, str]:
    """A line's row; a line of no known event has "" (its place in the recency order, `line_order`)."""
    return (agent_id, line.tick, line.seq, line.speaker, line.text, line.event or "")
