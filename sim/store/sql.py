"""The writer's statements and the queries that load hot state and resume metadata.

Pure text, plus `fetch`, the one way the store reads a query's rows, and
`bulk_parameters`, the one way the writer hands a batch of rows to a `BULK` statement. Public, like
`sim.store.records`: the store's format is documented (docs/store.md), and a benchmark or a
tool that measures the store against plain SQLite must run exactly these statements.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import aiosqlite
import msgspec

__all__ = [
    "BULK",
    "BULK_REPLACED_BELIEFS",
    "HEARD_RECENT",
    "INSERT",
    "BLOB_LAST",
    "ITEM_BODIES",
    "LOAD_FACTS",
    "LOAD_KEPT",
    "LOAD_PROMPTS",
    "LOAD_SUMMARIES",
    "LOAD_WORLD",
    "PLACE_LOG",
    "RECENT",
    "REPLACED_BELIEF",
    "SELECT_AGENT_KEYS",
    "SELECT_ALL_INPUTS",
    "SELECT_INPUTS",
    "SELECT_LAST_TICK",
    "SELECT_PENDING",
    "SELECT_RUN",
    "SELECT_SAYS",
    "SELECT_SENT",
    "SET_LAST_TICK",
    "RowKind",
    "bulk_parameters",
    "fetch",
]

RowKind = Literal[
    "agent", "fact", "world", "episode", "agent_key", "item", "heard", "belief", "line", "audit", "input", "meta",
    "place", "place_events", "place_window", "run", "world_change", "scenario", "kept", "summary",
]
"""What a queued row is: its statement in `INSERT`, except `episode` and `place` (which the
writer turns into `item` rows and `heard` or `place_events` rows, `sim.store._items`)."""

# Statements by row kind, in the order a batch runs them.
INSERT: dict[RowKind, str] = {
    "agent": "INSERT OR IGNORE INTO agents (agent, system_prompt) VALUES (?, ?)",
    "fact": "INSERT OR REPLACE INTO facts (agent, id, text, writer, withdrawn) VALUES (?, ?, ?, ?, ?)",
    "world": "INSERT INTO world (agent, key, value, writer) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (agent, key) DO UPDATE SET value = excluded.value, writer = excluded.writer",
    "agent_key": "INSERT INTO agent_keys (n, agent) VALUES (?, ?)",
    "item": "INSERT OR IGNORE INTO items (k, body) VALUES (?, ?)",
    "heard": "INSERT INTO heard (agent, tick, items) VALUES (?, ?, ?)",
    "place_events": "INSERT INTO place_events (place, tick, items) VALUES (?, ?, ?)",
    "place_window": "INSERT INTO place_windows (place, since) VALUES (?, ?)"
    " ON CONFLICT (place) DO UPDATE SET since = excluded.since",
    "kept": "INSERT OR REPLACE INTO kept (agent, slot, body) VALUES (?, ?, ?)",
    "summary": "INSERT OR REPLACE INTO summaries (place, slot, events, body) VALUES (?, ?, ?, ?)",
    "belief": "INSERT INTO beliefs (agent, id, tick, text, confidence) VALUES (?, ?, ?, ?, ?)",
    "line": "INSERT INTO dialogue (agent, tick, seq, speaker, text, event) VALUES (?, ?, ?, ?, ?, ?)",
    "audit": "INSERT OR IGNORE INTO audit (id, run_id, agent, tick, backend, model, fallback, line, record)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "input": "INSERT OR REPLACE INTO inputs (tick, seq, input) VALUES (?, ?, ?)",
    "meta": "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
    "run": "INSERT OR REPLACE INTO run (id, identity) VALUES (0, ?)",
    "world_change": "INSERT OR REPLACE INTO world_changes (tick, state) VALUES (?, ?)",
    "scenario": "INSERT OR REPLACE INTO scenario (id, sha256, data) VALUES (0, ?, ?)",
}
# The row kinds whose last value is a blob: it travels apart from the JSON rows (as an
# offset and a length into one blob of all of them); every other value is JSON.
BLOB_LAST: frozenset[RowKind] = frozenset(
    {"item", "heard", "place_events", "audit", "meta", "scenario", "kept", "summary"}
)


def _bulk(statement: str, blob_last: bool) -> str:
    """`statement` (one row's `INSERT ... VALUES (...)`) for many rows at once: its values taken
    from a JSON array of rows (`?1`) and, with `blob_last`, one blob of the rows' blobs (`?2`)."""
    head, _, rest = statement.partition(" VALUES (")
    values, _, tail = rest.partition(")")
    placeholders = [n for n, value in enumerate(values.split(", ")) if value == "?"]
    expressions = values.split(", ")
    for at, n in enumerate(placeholders):
        expressions[n] = f"j.value ->> {at}"
    if blob_last:
        at = len(placeholders) - 1
        expressions[placeholders[-1]] = f"substr(?2, j.value ->> {at}, j.value ->> {at + 1})"
    return f"{head} SELECT {', '.join(expressions)} FROM json_each(?1) AS j WHERE true{tail}"


BULK: dict[RowKind, str] = {kind: _bulk(sql, kind in BLOB_LAST) for kind, sql in INSERT.items()}
"""The writer's statements: each `INSERT` for a whole batch of rows in one call, so SQLite
runs the rows without taking the GIL back for each one (`executemany` does, and waits for
the event loop's thread to let go of it every time). `bulk_parameters` makes the
parameters; the rows are stored exactly as `INSERT` stores them."""

# A belief replaces the agent's belief with the same id (a refreshed belief is not a copy,
# and an NPC that is spoken to every tick does not grow its table by a row a tick): the
# writer deletes it before inserting a batch's beliefs (the last of a batch per id), with
# the batch's own `BULK["belief"]` parameters, or row by row where those fall back to `INSERT`.
BULK_REPLACED_BELIEFS = (
    "DELETE FROM beliefs WHERE n IN (SELECT b.n FROM json_each(?1) AS j"
    " JOIN beliefs AS b ON b.agent = j.value ->> 0 AND b.id = j.value ->> 1)"
)
REPLACED_BELIEF = "DELETE FROM beliefs WHERE agent = ? AND id = ?"

_JSON = msgspec.json.Encoder()
_NUL = b"\\u0000"  # how JSON writes a NUL character, which SQLite's JSON functions cut text at


def bulk_parameters(kind: RowKind, rows: Sequence[tuple[Any, ...]]) -> tuple[bytes] | tuple[bytes, bytes] | None:
    """The parameters of `BULK[kind]` for `rows`, or None when a text holds a NUL character
    (those rows go one at a time, with `INSERT[kind]`)."""
    if kind in BLOB_LAST:
        blobs = [row[-1] for row in rows]
        lengths = [len(blob) for blob in blobs]
        ends = itertools.accumulate(lengths)  # the 1-based offset of a blob is its end minus its length, plus 1
        data = _JSON.encode([(*row[:-1], end - n + 1, n) for row, end, n in zip(rows, ends, lengths, strict=True)])
        return None if _NUL in data else (data, b"".join(blobs))
    data = _JSON.encode(rows)
    return None if _NUL in data else (data,)


SET_LAST_TICK = "INSERT OR REPLACE INTO meta (key, value) VALUES ('last_tick', ?)"
SELECT_LAST_TICK = "SELECT value FROM meta WHERE key = 'last_tick'"
SELECT_AGENT_KEYS = "SELECT agent, n FROM agent_keys"

# The agents in a JSON array (the one parameter).
_IDS = "agent IN (SELECT value FROM json_each(?))"
LOAD_PROMPTS = "SELECT agent, system_prompt FROM agents WHERE " + _IDS
LOAD_FACTS = "SELECT agent, id, text FROM facts WHERE withdrawn = 0 AND " + _IDS
LOAD_WORLD = "SELECT agent, key, value FROM world WHERE " + _IDS
LOAD_KEPT = "SELECT agent, slot, body FROM kept WHERE " + _IDS + " ORDER BY agent, slot"
LOAD_SUMMARIES = "SELECT place, slot, events, body FROM summaries ORDER BY place, slot"


# Newest `limit` rows per agent for the agents in a JSON array, oldest first: the same
# total order as NpcState's (tick, id, ...), so hot state is exactly the newest N. The
# correlated LIMIT walks each agent's recency index backwards and stops after N rows, so
# the cost follows the agents loaded, not the length of their history.
def _recent(table: str, columns: str, order: str) -> str:
    newest_first = ", ".join(f"{c} DESC" for c in order.split(", "))
    return (
        f"SELECT t.agent, {', '.join('t.' + c for c in columns.split(', '))} FROM json_each(?) AS j"
        f" JOIN {table} AS t ON t.n IN (SELECT n FROM {table} WHERE agent = j.value"
        f" ORDER BY {newest_first} LIMIT ?) ORDER BY t.agent, {', '.join('t.' + c for c in order.split(', '))}"
    )


RECENT: dict[Literal["beliefs", "dialogue"], str] = {
    "beliefs": _recent("beliefs", "id, tick, text, confidence", "tick, id, text, confidence"),
    "dialogue": _recent("dialogue", "tick, seq, speaker, text, event", "tick, seq, speaker, text, event"),
}

# Heard rows hold several items each, so the newest `limit` rows by tick hold at least
# `limit` items; every row of the boundary tick is taken too, and Python keeps the newest
# `limit` items by (tick, id).
HEARD_RECENT = (
    "SELECT a.agent, h.items FROM json_each(?) AS j JOIN agent_keys AS a ON a.agent = j.value"
    " JOIN heard AS h ON h.agent = a.n AND h.tick >= IFNULL((SELECT tick FROM heard WHERE agent = a.n"
    " ORDER BY tick DESC LIMIT 1 OFFSET ?), -1)"
)
ITEM_BODIES = "SELECT k, body FROM items WHERE k IN (SELECT value FROM json_each(?))"

SELECT_INPUTS = "SELECT input FROM inputs WHERE tick = ? ORDER BY seq"
SELECT_ALL_INPUTS = "SELECT tick, input FROM inputs ORDER BY tick, seq"
SELECT_SENT = "SELECT value FROM meta WHERE key = 'sent'"
SELECT_SAYS = "SELECT value FROM meta WHERE key = 'says'"
SELECT_RUN = "SELECT identity FROM run WHERE id = 0"
SELECT_PENDING = "SELECT value FROM meta WHERE key = 'pending'"

# Every place's log from the tick its window still needs, in one query: rows in (place,
# tick) order, each row's items in the order they were appended.
PLACE_LOG = (
    "SELECT p.place, p.tick, p.items FROM place_windows AS w JOIN place_events AS p"
    " ON p.place = w.place AND p.tick >= w.since ORDER BY p.place, p.tick, p.rowid"
)


async def fetch(conn: aiosqlite.Connection, sql: str, params: tuple[Any, ...]) -> Iterable[Any]:
    """All rows of one query."""
    async with conn.execute(sql, params) as cursor:
        return await cursor.fetchall()
