"""The places' logs on disk: a place's events of a tick as one row, read back in one query.

`Store.add_place_events` queues the row (its events as content-addressed items, so an
event is stored once however many hear it) and, when the place's window moved, the tick
from which its log is still needed (`place_windows`). `load_place_log` reads every place's
rows from that tick on, in one query whatever the number of places, and the items'
bodies in chunks: what a resumed shard rebuilds its windows and its addressed mail from.
`load_summaries` reads every place's summaries of its talk (`sim.memory.summary_of`), each
with the ids of the events it folds: what a shard's NPCs recall, and how a summary is
traced to what was said.
"""

from __future__ import annotations

import json

import aiosqlite
import msgspec

from sim.memory import Episode
from sim.store.records import unpack_keys
from sim.store.sql import ITEM_BODIES, LOAD_SUMMARIES, PLACE_LOG, fetch
from sim.wire.events import AnyEvent

__all__ = ["PlaceRows", "Summaries", "Summary", "load_place_log", "load_summaries"]

_EVENT_DECODER = msgspec.msgpack.Decoder(AnyEvent)
_EPISODE_DECODER = msgspec.msgpack.Decoder(Episode)
_EVENTS_DECODER = msgspec.json.Decoder(tuple[str, ...])
_BODIES_PER_QUERY = 100_000

PlaceRows = dict[str, list[tuple[int, tuple[AnyEvent, ...]]]]
"""Each place's rows still needed: (tick, the events appended then, in order), oldest first."""


class Summary(msgspec.Struct, frozen=True):
    """A summary of a place's talk in its slot, with the ids of the events it folds."""

    slot: int
    episode: Episode
    events: tuple[str, ...]


Summaries = dict[str, list[Summary]]
"""Each place's summaries, by slot."""


async def load_place_log(conn: aiosqlite.Connection) -> PlaceRows:
    """Every place's log from its window's tick on. Raises sqlite3.Error; the caller names the file."""
    rows = [(str(place), int(tick), unpack_keys(blob)) for place, tick, blob in await fetch(conn, PLACE_LOG, ())]
    wanted = sorted({k for _, _, keys in rows for k in keys})
    bodies: dict[int, bytes] = {}
    for start in range(0, len(wanted), _BODIES_PER_QUERY):
        chunk = json.dumps(wanted[start : start + _BODIES_PER_QUERY])
        bodies.update(await fetch(conn, ITEM_BODIES, (chunk,)))
    log: PlaceRows = {}
    for place, tick, keys in rows:
        log.setdefault(place, []).append((tick, tuple(_EVENT_DECODER.decode(bodies[k]) for k in keys)))
    return log


async def load_summaries(conn: aiosqlite.Connection) -> Summaries:
    """Every place's summaries, by slot. Raises sqlite3.Error; the caller names the file."""
    found: Summaries = {}
    for place, slot, events, body in await fetch(conn, LOAD_SUMMARIES, ()):
        found.setdefault(str(place), []).append(
            Summary(int(slot), _EPISODE_DECODER.decode(body), _EVENTS_DECODER.decode(events)))
    return found
