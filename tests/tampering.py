"""Editing a store as someone outside npcsim would, for the tests of its seals (sim.store.seals).

`edit` runs SQL on a store file. `reseal` then computes every digest, MAC and link of the
chain again, as the writer computes them: what anybody can do to a store sealed without a
run key (its digests catch an accidental edit, not a forger), and only the key's holder to
a store sealed with one. Tests that change a record on purpose (to see replay name the
drift) reseal it, so the drift is what they see, not the broken chain.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sim.protocol.seal import RunKey
from sim.store._chain import genesis, link_digest, next_head
from sim.store.seals import AUDIT_DIGEST, SEALED, Sealer, digest

__all__ = ["edit", "redigest", "reseal"]


def edit(db: Path, *statements: str) -> None:
    """Run `statements` on the store file, in one transaction."""
    conn = sqlite3.connect(db)
    with conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


def redigest(db: Path, record_id: str) -> None:
    """Compute an audit row's digest again (it takes no key), as a forger would after editing it."""
    conn = sqlite3.connect(db)
    with conn:
        row = conn.execute(f"SELECT {', '.join(AUDIT_DIGEST[0])} FROM audit WHERE id = ?", (record_id,)).fetchone()
        conn.execute("UPDATE audit SET digest = ? WHERE id = ?", (digest("audit", row), record_id))
    conn.close()


def reseal(db: Path, key: RunKey | None = None) -> None:
    """Seal every row of the store and its chain again with `key` (None: no key)."""
    sealer = Sealer(key)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for table, (columns, _) in {**SEALED, "audit": AUDIT_DIGEST}.items():
            _reseal_table(conn, table, columns, sealer)
        conn.execute("INSERT OR REPLACE INTO meta (key, value, mac) VALUES ('seal', ?, ?)",
                     (sealer.check, sealer.mac("meta", ("seal", sealer.check))))
        (store_id,) = conn.execute("SELECT value FROM meta WHERE key = 'store'").fetchone()
        head = genesis(store_id)
        for n, tick in conn.execute("SELECT n, tick FROM chain ORDER BY n").fetchall():
            records = sorted(conn.execute("SELECT id, digest FROM audit WHERE link = ? UNION ALL"
                                          " SELECT id, digest FROM rotated WHERE link = ?", (n, n)).fetchall())
            inputs = conn.execute("SELECT tick, seq, mac FROM inputs WHERE link = ? ORDER BY tick, seq",
                                  (n,)).fetchall()
            worlds = conn.execute("SELECT tick, mac FROM world_changes WHERE link = ? ORDER BY tick",
                                  (n,)).fetchall()
            counts = (len(records), len(inputs), len(worlds))
            link = link_digest(records, inputs, worlds)
            head = next_head(head, n, tick, counts, link)
            conn.execute("UPDATE chain SET records = ?, inputs = ?, worlds = ?, digest = ?, head = ?, seal = ?"
                         " WHERE n = ?", (*counts, link, head, sealer.seal(head), n))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _reseal_table(conn: sqlite3.Connection, table: str, columns: tuple[str, ...], sealer: Sealer) -> None:
    """Every row of `table` again, with its `mac` (an audit row: its `digest`) computed anew."""
    cursor = conn.execute(f"SELECT * FROM {table}")
    names = [d[0] for d in cursor.description]
    rows = cursor.fetchall()
    at = names.index("digest" if table == "audit" else "mac")
    again = []
    for row in rows:
        values = dict(zip(names, row, strict=True))
        sealed = tuple(values[c] for c in columns)
        mac = digest(table, sealed) if table == "audit" or (table == "meta" and sealed[0] == "store") else (
            sealer.mac(table, sealed))
        again.append((*row[:at], mac, *row[at + 1 :]))
    conn.execute(f"DELETE FROM {table}")
    conn.executemany(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})", again)
