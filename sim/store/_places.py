"""The places' logs on disk: a place's events of a tick as one row, read back in one query.

`Store.add_place_events` queues the row (its events as content-addressed items, so an
event is stored once however many hear it) and, when the place's window moved, the tick
from which its log is still needed (`place_windows`). `load_place_log` reads every place's
rows from that tick on, in one query whatever the number of places, and the items'
bodies in chunks: what a resumed shard rebuilds its windows and its addressed mail from.
Every row and item read is checked against its seal (sim.store.seals).
`load_summaries` reads every place's summaries of its talk (`sim.memory.summary_of`), each
with the ids of the events it folds: what a shard's NPCs recall, and how a summary is
traced to what was said.
"""

from __future__ import annotations

import aiosqlite
import msgspec

from sim.memory import Episode
from sim.store._hot import item_bodies
from sim.store.records import unpack_keys
from sim.store.seals import Sealer
from sim.store.sql import LOAD_SUMMARIES, PLACE_LOG, fetch
from sim.wire.events import AnyEvent

__all__ = ["PlaceRows", "Summaries", "Summary", "load_place_log", "load_summaries"]

_EVENT_DECODER = msgspec.msgpack.Decoder(AnyEvent)
_EPISODE_DECODER = msgspec.msgpack.Decoder(Episode)
_EVENTS_DECODER = msgspec.json.Decoder(tuple[str, ...])

PlaceRows = dict[str, list[tuple[int, tuple[AnyEvent, ...]]]]
"""Each place's rows still needed: (tick, the events appended then, in order), oldest first."""


class Summary(msgspec.Struct, frozen=True):
    """A summary of a place's talk in its slot, with the ids of the events it folds."""

    slot: int
    episode: Episode
    events: tuple[str, ...]


Summaries = dict[str, list[Summary]]
"""Each place's summaries, by slot."""


async def load_place_log(conn: aiosqlite.Connection, sealer: Sealer, where: str) -> PlaceRows:
    """Every place's log from its window's tick on, checked with `sealer`. Raises sqlite3.Error;
    the caller names the file."""
    rows = []
    windows: set[str] = set()
    for place, tick, blob, mac, since, window_mac in await fetch(conn, PLACE_LOG, ()):
        if place not in windows:  # the place's window row, once
            sealer.check_row("place_windows", (place, since, window_mac), where)
            windows.add(place)
        sealer.check_row("place_events", (place, tick, blob, mac), where)
        rows.append((str(place), int(tick), unpack_keys(blob)))
    bodies = await item_bodies(conn, {k for _, _, keys in rows for k in keys}, where)
    log: PlaceRows = {}
    for place, tick, keys in rows:
        log.setdefault(place, []).append((tick, tuple(_EVENT_DECODER.decode(bodies[k]) for k in keys)))
    return log


async def load_summaries(conn: aiosqlite.Connection, sealer: Sealer, where: str) -> Summaries:
    """Every place's summaries, by slot, checked with `sealer`. Raises sqlite3.Error; the caller names the file."""
    found: Summaries = {}
    for place, slot, events, body, mac in await fetch(conn, LOAD_SUMMARIES, ()):
        sealer.check_row("summaries", (place, slot, events, body, mac), where)
        found.setdefault(str(place), []).append(
            Summary(int(slot), _EPISODE_DECODER.decode(body), _EVENTS_DECODER.decode(events)))
    return found
