"""Retention: what may be pruned from NPC memories without losing anything that is used.

A working memory is built from the hot state only: the newest `hot_limit` items per
flexible category (episodic, beliefs, dialogue), which a restarted shard loads back from
disk. So memories older than an agent's newest `keep` items (`keep` >= the hot limit)
can never reach a prompt again, and `Store.prune_memories(keep)` deletes them. The audit
needs none of these rows: a record references its state's items in the `items` table,
which pruning never touches, so every record still replays.

The places' logs (`place_events`, one row per place and tick) are pruned by the windows
the shard keeps: with `record.retain_memories` N they hold at least `max(N, hot limit)` events
not said by each listener, and rows older than a window's first tick go.

`heard` rows hold several episodes each: a row is deleted once the agent heard at least
`keep` episodes in newer ticks, so at least `keep` episodes stay (at most a tick more).
Beliefs and dialogue lines are kept by the order `load_agents` reads them in. Each
statement is one pass over its table (a window function), whose size retention itself
bounds.
"""

from __future__ import annotations

__all__ = ["PRUNE_SQL"]


def _older_rows(table: str, order: str) -> str:
    """Rows past the agent's newest `keep` in load order (one pass, no correlation)."""
    newest_first = ", ".join(f"{c} DESC" for c in order.split(", "))
    return (
        f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM (SELECT rowid,"
        f" row_number() OVER (PARTITION BY agent ORDER BY {newest_first}) AS r FROM {table}) WHERE r > ?)"
    )


# A heard row goes when the agent heard at least `keep` episodes in strictly newer ticks:
# then none of its episodes is among the newest `keep`, whatever their ids.
_HEARD = (
    "DELETE FROM heard WHERE rowid IN (SELECT rowid FROM (SELECT rowid, sum(length(items) / 8) OVER"
    " (PARTITION BY agent ORDER BY tick DESC RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS newer"
    " FROM heard) WHERE newer >= ?)"
)

# A place row goes when it is older than the tick from which the place's window still
# needs its log: the shard's windows keep `max(keep, hot limit)` events not said by each
# listener there (sim.shard._window), so nothing a listener could still need goes.
_PLACE_EVENTS = (
    "DELETE FROM place_events WHERE rowid IN (SELECT p.rowid FROM place_events AS p"
    " JOIN place_windows AS w ON w.place = p.place WHERE p.tick < w.since)"
)

# (table, statement, whether it takes the one parameter `keep`).
PRUNE_SQL: tuple[tuple[str, str, bool], ...] = (
    ("heard", _HEARD, True),
    ("beliefs", _older_rows("beliefs", "tick, id, text, confidence"), True),
    ("dialogue", _older_rows("dialogue", "tick, seq, speaker, text, event"), True),
    ("place_events", _PLACE_EVENTS, False),
)
