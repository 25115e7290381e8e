"""The places' logs on disk: a place's events of a tick as one row, read back in one query.

`Store.add_place_events` queues the row (its events as content-addressed items, so an
event is stored once however many hear it) and, when the place's window moved, the tick
from which its log is still needed (`place_windows`). `load_place_log` reads every place's
rows from that tick on, in one query whatever the number of places, and the items'
bodies in chunks: what a resumed shard rebuilds its windows and its addressed mail from.
"""

from __future__ import annotations

import json

import aiosqlite
import msgspec

from sim.store.records import unpack_keys
from sim.store.sql import ITEM_BODIES, PLACE_LOG, fetch
from sim.wire.events import AnyEvent

__all__ = ["PlaceRows", "load_place_log"]

_EVENT_DECODER = msgspec.msgpack.Decoder(AnyEvent)
_BODIES_PER_QUERY = 100_000

PlaceRows = dict[str, list[tuple[int, tuple[AnyEvent, ...]]]]
"""Each place's rows still needed: (tick, the events appended then, in order), oldest first."""


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
