"""Hot state: each loaded agent's bounded state in memory, so `Store.state()` never queries.

An agent's hot state holds all its facts and world state and the newest `limit` items of
each flexible category (episodic, beliefs, dialogue) in NpcState's recency order; that is
all a working memory is built from. Beside it, `kept` holds the agent's significant
episodes from its whole history (at most `MAX_KEPT`, by slot: `sim.memory` recall), what a
scored selection may recall. `load_hot` reads it for many agents at once, in eight
queries whatever their number, and checks every row it reads against its seal and every
item against its content address (sim.store.seals): an edited or injected row is a
TamperError naming its table and row, never a memory.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import aiosqlite
import msgspec

from sim.errors import TamperError
from sim.memory import (
    KEEP_SIGNIFICANCE,
    MAX_KEPT,
    Belief,
    Episode,
    Fact,
    Line,
    NpcState,
    WorldFact,
    belief_order,
    episode_order,
    kept_rank,
    line_order,
    strength,
)
from sim.store.records import item, unpack_keys
from sim.store.seals import Sealer
from sim.store.sql import HEARD_RECENT, ITEM_BODIES, LOAD_FACTS, LOAD_KEPT, LOAD_PROMPTS, LOAD_WORLD, RECENT, fetch

__all__ = ["Hot", "item_bodies", "load_hot"]

T = TypeVar("T")

_EPISODE_DECODER = msgspec.msgpack.Decoder(Episode)
_BODIES_PER_QUERY = 100_000


def _insert_bounded(items: list[T], item: T, key: Callable[[T], Any], limit: int) -> None:
    """Insert in recency order and keep only the newest `limit` items."""
    k = key(item)
    if len(items) >= limit and k <= key(items[0]):
        return
    bisect.insort(items, item, key=key)
    if len(items) > limit:
        del items[0]


class Hot:
    """One agent's state in memory; `state()` builds its NpcState once per change."""

    __slots__ = ("agent_id", "beliefs", "dialogue", "episodic", "facts", "kept", "limit", "snapshot", "system_prompt",
                 "world")

    def __init__(self, agent_id: str, system_prompt: str, limit: int) -> None:
        self.agent_id = agent_id
        self.system_prompt = system_prompt
        self.limit = limit
        self.facts: dict[str, Fact] = {}
        self.world: dict[str, WorldFact] = {}
        self.episodic: list[Episode] = []
        self.beliefs: list[Belief] = []
        self.dialogue: list[Line] = []
        self.kept: list[Episode] = []  # by slot
        self.snapshot: NpcState | None = None

    @classmethod
    def created(cls, state: NpcState, limit: int) -> Hot:
        """A new agent's hot state: its whole initial state, each log cut to its last `limit` items."""
        hot = cls(state.agent_id, state.system_prompt, limit)
        hot.facts = {f.id: f for f in state.canonical_facts}
        hot.world = {w.key: w for w in state.world_state}
        hot.episodic = list(state.episodic[-limit:])
        hot.beliefs = list(state.beliefs[-limit:])
        hot.dialogue = list(state.dialogue[-limit:])
        return hot

    def state(self) -> NpcState:
        if self.snapshot is None:
            self.snapshot = NpcState(
                agent_id=self.agent_id,
                system_prompt=self.system_prompt,
                canonical_facts=tuple(self.facts.values()),
                world_state=tuple(self.world.values()),
                episodic=tuple(self.episodic),
                beliefs=tuple(self.beliefs),
                dialogue=tuple(self.dialogue),
            )
        return self.snapshot

    def add_fact(self, fact: Fact) -> None:
        """Add or replace a fact (the caller checked the game may)."""
        self.facts[fact.id] = fact
        self.snapshot = None

    def withdraw_fact(self, fact_id: str) -> None:
        del self.facts[fact_id]
        self.snapshot = None

    def set_world(self, entry: WorldFact) -> None:
        self.world[entry.key] = entry
        self.snapshot = None

    def add_episode(self, episode: Episode) -> None:
        _insert_bounded(self.episodic, episode, episode_order, self.limit)
        self.snapshot = None

    def add_episodes(self, episodes: Sequence[Episode]) -> None:
        """Several episodes at once: one sort, then the newest `limit` kept."""
        merged = sorted((*self.episodic, *episodes), key=episode_order)
        self.episodic = merged[-self.limit :]
        self.snapshot = None

    def add_belief(self, belief: Belief) -> None:
        """A belief replaces the one with its id (a belief refreshed is not a copy): the same
        replacement the store makes on disk, so the hot state stays the newest `limit` of
        what a restart loads."""
        self.beliefs = [b for b in self.beliefs if b.id != belief.id]
        _insert_bounded(self.beliefs, belief, belief_order, self.limit)
        self.snapshot = None

    def add_line(self, line: Line) -> None:
        _insert_bounded(self.dialogue, line, line_order, self.limit)
        self.snapshot = None

    def keep(self, episode: Episode) -> int | None:
        """Keep a significant episode for recall; the slot it took, or None when it is not
        significant, is kept already, or is weaker than everything a full store holds (the
        weakest gives its slot up otherwise: the same choice a restart's order makes)."""
        kept = self.kept
        if episode.significance < KEEP_SIGNIFICANCE or any(e.id == episode.id for e in kept):
            return None
        if len(kept) < MAX_KEPT:
            kept.append(episode)
            return len(kept) - 1
        weakest = kept_rank(kept)
        if strength(episode) <= strength(kept[weakest]):
            return None
        kept[weakest] = episode
        return weakest


async def load_hot(
    conn: aiosqlite.Connection, agent_ids: Sequence[str], limit: int, sealer: Sealer, where: str
) -> dict[str, Hot]:
    """The hot state of those of `agent_ids` that are on disk, in eight queries, each row
    checked with `sealer` (`where` names the store in a TamperError).

    Raises sqlite3.Error; the caller names the file.
    """
    ids = json.dumps(agent_ids)
    prompts = await _sealed(conn, LOAD_PROMPTS, (ids,), "agents", sealer, where)
    facts = await _sealed(conn, LOAD_FACTS, (ids,), "facts", sealer, where)
    world = await _sealed(conn, LOAD_WORLD, (ids,), "world", sealer, where)
    heard = await _heard(conn, ids, limit, sealer, where)
    beliefs = await _sealed(conn, RECENT["beliefs"], (ids, limit), "beliefs", sealer, where)
    dialogue = await _sealed(conn, RECENT["dialogue"], (ids, limit), "dialogue", sealer, where)
    kept = await _sealed(conn, LOAD_KEPT, (ids,), "kept", sealer, where)
    loaded = {agent: Hot(agent, prompt, limit) for agent, prompt, _ in prompts}
    for agent, fid, text, _writer, withdrawn, _ in facts:
        if not withdrawn:  # a withdrawn fact is a row never loaded, checked all the same
            loaded[agent].facts[fid] = Fact(id=fid, text=text)
    for agent, key, value, _writer, _ in world:
        loaded[agent].world[key] = WorldFact(key=key, value=value)
    for agent, episodes in heard.items():
        episodes.sort(key=episode_order)
        loaded[agent].episodic = episodes[-limit:]
    for agent, bid, tick, text, confidence, _ in beliefs:
        loaded[agent].beliefs.append(Belief(id=bid, tick=tick, text=text, confidence=confidence))
    for agent, tick, seq, speaker, text, event, _ in dialogue:
        loaded[agent].dialogue.append(Line(tick=tick, seq=seq, speaker=speaker, text=text, event=event or None))
    for agent, _slot, body, _ in kept:  # slots in order, with no gap: they are taken in turn
        loaded[agent].kept.append(_EPISODE_DECODER.decode(body))
    return loaded


async def _sealed(conn: aiosqlite.Connection, sql: str, params: tuple[Any, ...], table: str, sealer: Sealer,
                  where: str) -> list[Any]:
    """The rows of a query of a sealed table's columns and `mac`, each checked."""
    rows = list(await fetch(conn, sql, params))
    sealer.check_rows(table, rows, where)
    return rows


async def _heard(
    conn: aiosqlite.Connection, ids: str, limit: int, sealer: Sealer, where: str
) -> dict[str, list[Episode]]:
    """Each agent's newest episodes from `heard` (a superset of the newest `limit`)."""
    rows = await fetch(conn, HEARD_RECENT, (ids, limit - 1))
    keys: dict[str, list[int]] = {}
    for n, agent, key_mac, _, _, blob, _ in rows:
        if agent not in keys:  # the agent's key row, once
            sealer.check_row("agent_keys", (n, agent, key_mac), where)
            keys[agent] = []
        keys[agent].extend(unpack_keys(blob))
    sealer.check_rows("heard", (row[3:] for row in rows), where)
    bodies = await item_bodies(conn, {k for ks in keys.values() for k in ks}, where)
    return {agent: [_EPISODE_DECODER.decode(bodies[k]) for k in ks] for agent, ks in keys.items()}


async def item_bodies(conn: aiosqlite.Connection, keys: set[int], where: str) -> dict[int, bytes]:
    """The bodies of these items, each checked against its key (the first bytes of its digest)."""
    wanted = sorted(keys)
    bodies: dict[int, bytes] = {}
    for start in range(0, len(wanted), _BODIES_PER_QUERY):
        chunk = json.dumps(wanted[start : start + _BODIES_PER_QUERY])
        bodies.update(await fetch(conn, ITEM_BODIES, (chunk,)))
    for k, body in bodies.items():
        if item(body).key != k:
            raise TamperError(f"{where}: item {k} does not match its digest: it was edited outside npcsim")
    return bodies
