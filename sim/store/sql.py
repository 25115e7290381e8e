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
    "CHAINED",
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
    "SELECT_RUN",
    "SELECT_SCENARIO",
    "SELECT_META",
    "SET_LAST_TICK",
    "TABLES",
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

# Statements by row kind, in the order a batch runs them. A row is queued as its producer
# makes it; the writer adds `link` (the commit) to the chained kinds and then the row's
# `mac` (an audit row's `digest`), before the blob where the last value is one
# (sim.store.seals: what they cover).
INSERT: dict[RowKind, str] = {
    "agent": "INSERT OR IGNORE INTO agents (agent, system_prompt, mac) VALUES (?, ?, ?)",
    "fact": "INSERT OR REPLACE INTO facts (agent, id, text, writer, withdrawn, mac) VALUES (?, ?, ?, ?, ?, ?)",
    "world": "INSERT INTO world (agent, key, value, writer, mac) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (agent, key) DO UPDATE SET value = excluded.value, writer = excluded.writer, mac = excluded.mac",
    "agent_key": "INSERT INTO agent_keys (n, agent, mac) VALUES (?, ?, ?)",
    "item": "INSERT OR IGNORE INTO items (k, body) VALUES (?, ?)",
    "heard": "INSERT INTO heard (agent, tick, mac, items) VALUES (?, ?, ?, ?)",
    "place_events": "INSERT INTO place_events (place, tick, mac, items) VALUES (?, ?, ?, ?)",
    "place_window": "INSERT INTO place_windows (place, since, mac) VALUES (?, ?, ?)"
    " ON CONFLICT (place) DO UPDATE SET since = excluded.since, mac = excluded.mac",
    "kept": "INSERT OR REPLACE INTO kept (agent, slot, mac, body) VALUES (?, ?, ?, ?)",
    "summary": "INSERT OR REPLACE INTO summaries (place, slot, events, mac, body) VALUES (?, ?, ?, ?, ?)",
    "belief": "INSERT INTO beliefs (agent, id, tick, text, confidence, mac) VALUES (?, ?, ?, ?, ?, ?)",
    "line": "INSERT INTO dialogue (agent, tick, seq, speaker, text, event, mac) VALUES (?, ?, ?, ?, ?, ?, ?)",
    "audit": "INSERT OR IGNORE INTO audit (id, run_id, agent, tick, backend, model, fallback, line, link, digest,"
    " record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "input": "INSERT OR REPLACE INTO inputs (tick, seq, input, link, mac) VALUES (?, ?, ?, ?, ?)",
    "meta": "INSERT OR REPLACE INTO meta (key, mac, value) VALUES (?, ?, ?)",
    "run": "INSERT OR REPLACE INTO run (id, identity, mac) VALUES (0, ?, ?)",
    "world_change": "INSERT OR REPLACE INTO world_changes (tick, state, link, mac) VALUES (?, ?, ?, ?)",
    "scenario": "INSERT OR REPLACE INTO scenario (id, sha256, mac, data) VALUES (0, ?, ?, ?)",
}
TABLES: dict[RowKind, str] = {
    "agent": "agents", "fact": "facts", "world": "world", "agent_key": "agent_keys", "heard": "heard",
    "place_events": "place_events", "place_window": "place_windows", "kept": "kept", "summary": "summaries",
    "belief": "beliefs", "line": "dialogue", "audit": "audit", "input": "inputs", "meta": "meta", "run": "run",
    "world_change": "world_changes", "scenario": "scenario",
}
"""The table each kind's rows go to (items are content-addressed, not sealed)."""
CHAINED: frozenset[RowKind] = frozenset({"audit", "input", "world_change"})
"""The kinds whose rows carry `link`, the commit that wrote them (sim.store._chain)."""
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


SET_LAST_TICK = "INSERT OR REPLACE INTO meta (key, value, mac) VALUES ('last_tick', ?, ?)"
SELECT_LAST_TICK = "SELECT value FROM meta WHERE key = 'last_tick'"
SELECT_META = "SELECT key, value, mac FROM meta WHERE key = ?"
SELECT_AGENT_KEYS = "SELECT agent, n FROM agent_keys"

# The agents in a JSON array (the one parameter).
_IDS = "agent IN (SELECT value FROM json_each(?))"
LOAD_PROMPTS = "SELECT agent, system_prompt, mac FROM agents WHERE " + _IDS
LOAD_FACTS = "SELECT agent, id, text, writer, withdrawn, mac FROM facts WHERE " + _IDS
LOAD_WORLD = "SELECT agent, key, value, writer, mac FROM world WHERE " + _IDS
LOAD_KEPT = "SELECT agent, slot, body, mac FROM kept WHERE " + _IDS + " ORDER BY agent, slot"
LOAD_SUMMARIES = "SELECT place, slot, events, body, mac FROM summaries ORDER BY place, slot"


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
    "beliefs": _recent("beliefs", "id, tick, text, confidence, mac", "tick, id, text, confidence"),
    "dialogue": _recent("dialogue", "tick, seq, speaker, text, event, mac", "tick, seq, speaker, text, event"),
}

# Heard rows hold several items each, so the newest `limit` rows by tick hold at least
# `limit` items; every row of the boundary tick is taken too, and Python keeps the newest
# `limit` items by (tick, id). Each row comes with the agent's key row: both are checked.
HEARD_RECENT = (
    "SELECT a.n, a.agent, a.mac, h.agent, h.tick, h.items, h.mac FROM json_each(?) AS j"
    " JOIN agent_keys AS a ON a.agent = j.value"
    " JOIN heard AS h ON h.agent = a.n AND h.tick >= IFNULL((SELECT tick FROM heard WHERE agent = a.n"
    " ORDER BY tick DESC LIMIT 1 OFFSET ?), -1)"
)
ITEM_BODIES = "SELECT k, body FROM items WHERE k IN (SELECT value FROM json_each(?))"

# An input with its sealed columns (tick, seq, input, link) and its mac.
SELECT_INPUTS = "SELECT tick, seq, input, link, mac FROM inputs WHERE tick = ? ORDER BY seq"
SELECT_ALL_INPUTS = "SELECT tick, seq, input, link, mac FROM inputs ORDER BY tick, seq"
SELECT_RUN = "SELECT identity, mac FROM run WHERE id = 0"
SELECT_SCENARIO = "SELECT sha256, data, mac FROM scenario WHERE id = 0"

# Every place's log from the tick its window still needs, in one query: rows in (place,
# tick) order, each row's items in the order they were appended.
PLACE_LOG = (
    "SELECT p.place, p.tick, p.items, p.mac, w.since, w.mac FROM place_windows AS w JOIN place_events AS p"
    " ON p.place = w.place AND p.tick >= w.since ORDER BY p.place, p.tick, p.rowid"
)


async def fetch(conn: aiosqlite.Connection, sql: str, params: tuple[Any, ...]) -> Iterable[Any]:
    """All rows of one query."""
    async with conn.execute(sql, params) as cursor:
        return await cursor.fetchall()
