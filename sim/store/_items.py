"""Content addressing on the writer's side: episodes, events and audit records become items stored once.

Producers queue an episode as `(agent, tick, item)`, a place's events of a tick as
`(place, tick, items)` and an audit record as its columns, its packed blob and the items it
references (`sim.store.records`). Before a batch runs, `Addresser.address` turns these into
`item` rows (each item once), `heard` rows (an agent's episodes of one tick in one batch
are one row), `place_events` rows and the agents' small integer keys, so producers only
encode and queue. It remembers the items written with their check, so
a different body under a known key fails the batch loudly; past `_ITEM_CACHE` keys it
forgets them all and lets the database's collision trigger check the next ones.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sim.errors import StoreError
from sim.memory import Episode
from sim.store.records import Item, item, pack_keys
from sim.store.sql import RowKind
from sim.wire.events import AnyEvent

__all__ = ["Addresser", "episode_item", "event_item"]

_ENCODER = msgspec.msgpack.Encoder()
_ITEM_CACHE = 1 << 18


def episode_item(episode: Episode) -> Item:
    """The episode as an item: its msgpack body, addressed by its digest."""
    return item(_ENCODER.encode(episode))


def event_item(event: AnyEvent) -> Item:
    """An event of a place's log as an item: its msgpack body (with its type tag)."""
    return item(_ENCODER.encode(event))


class Addresser:
    """Turns a batch's queued episodes and records into item, heard and audit rows."""

    __slots__ = ("_agent_keys", "_checks")

    def __init__(self, agent_keys: dict[str, int]) -> None:
        self._agent_keys = agent_keys
        self._checks: dict[int, int] = {}

    def address(self, rows: dict[RowKind, list[tuple[Any, ...]]]) -> None:
        """Rewrite `rows` in place: each item once, an agent's episodes of a tick as one heard row.

        Raises StoreError for two different items under one key; then nothing of the
        batch may be written.
        """
        items: list[tuple[int, bytes]] = []
        checks = self._checks

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
        places = rows.pop("place", None)
        if places:
            place_events = rows.setdefault("place_events", [])
            for place, tick, its in places:
                for it in its:
                    add(it)
                place_events.append((place, tick, pack_keys([it.key for it in its])))
        audits = rows.get("audit")
        if audits:
            for row in audits:
                for it in row[-1]:
                    add(it)
            rows["audit"] = [row[:-1] for row in audits]
        if items:
            rows.setdefault("item", []).extend(items)

    def _agent_key(self, agent: str, rows: dict[RowKind, list[tuple[Any, ...]]]) -> int:
        """The agent's small integer key in `heard` rows, assigned on first use."""
        key = self._agent_keys.get(agent)
        if key is None:
            key = self._agent_keys[agent] = len(self._agent_keys) + 1
            rows.setdefault("agent_key", []).append((key, agent))
        return key
