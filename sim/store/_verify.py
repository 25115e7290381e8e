"""Checking a store against its seals: what a start reads first (`check_opening`), and
everything (`verify_store`, `npcsim audit verify`).

`verify_store` walks the chain commit by commit: each record's digest, each input's and
world change's MAC, what a rotation left of the records it deleted, the link's digest of
them all, its head and its seal; then every row of every sealed table and every item's
content address. The first thing that does not verify is a TamperError naming it (the tick
and commit, the record, input or row) in one line. Without the key of a store sealed with
one, the digests and the chain's heads are checked, not the MACs and seals.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiosqlite
import msgspec

from sim.errors import StoreError, TamperError
from sim.protocol.seal import RunKey
from sim.store._chain import SELECT_LINKS, Link, check_chain, check_link, genesis, link_digest
from sim.store.records import item
from sim.store.seals import AUDIT_DIGEST, SEALED, Sealer, describe, digest
from sim.store.sql import SELECT_META, SELECT_RUN, SELECT_SCENARIO

__all__ = ["Verification", "check_opening", "counted", "key_mismatch", "verify_store"]

# Read with the chain, link by link (the rest of the sealed tables after it).
_CHAINED = {
    "audit": f"SELECT {', '.join(AUDIT_DIGEST[0])}, digest FROM audit ORDER BY link",
    "rotated": "SELECT id, link, digest, mac FROM rotated ORDER BY link",
    "inputs": "SELECT tick, seq, input, link, mac FROM inputs ORDER BY link, tick, seq",
    "world_changes": "SELECT tick, state, link, mac FROM world_changes ORDER BY link, tick",
}
_LAST_TICKS = "SELECT (SELECT value FROM meta WHERE key = 'last_tick'), max(tick) FROM chain"
_LINK_AT = {"audit": AUDIT_DIGEST[0].index("link"), "rotated": 1, "inputs": 3, "world_changes": 2}


class Verification(msgspec.Struct, frozen=True, kw_only=True):
    """What a store that verifies holds: its commits and last tick, the records (and those a
    rotation removed), inputs and world changes its chain covers, the other sealed rows and
    the items checked, its chain's head (hex); `keyed`: sealed with a run key; `sealed`:
    the MACs and seals were checked (False: a keyed store and no key at hand)."""

    commits: int
    last_tick: int | None
    records: int
    rotated: int
    inputs: int
    world_changes: int
    rows: int
    items: int
    head: str
    keyed: bool
    sealed: bool


def key_mismatch(path: Path, marker: int, sealer: Sealer, key_name: str) -> str | None:
    """Why a start with `sealer` (its key: `key_name`) cannot use a store sealed with the key
    whose check value is `marker`; None when it can."""
    if marker == sealer.check:
        return None
    if marker == Sealer().check:
        return (f"{path} is not sealed with a run key (its first start had none), and this start has {key_name}: "
                "start it as its first start was")
    if not sealer.keyed:
        return (f"{path} is sealed with a run key, and this start has none: give --run-key-file the key of its "
                f"first start (--broker auto keeps it beside the store, {path.name}.key)")
    return (f"{path} is sealed with another run key than {key_name}, so its seals do not verify and this shard "
            "would refuse its own messages and wait for itself: resume with the key of the run's first start")


def _check_meta(sealer: Sealer | None, row: tuple[Any, ...], where: str) -> None:
    """A `meta` row (key, value, mac): the store's id carries a digest (it is made before any key)."""
    if row[0] == "store":
        if digest("meta", row[:2]) != row[2]:
            raise TamperError(f"{where}: meta row (key 'store') does not match its digest: it was edited "
                              "outside npcsim")
    elif sealer is not None:
        sealer.check_row("meta", row, where)


async def check_opening(
    conn: aiosqlite.Connection, path: Path, sealer: Sealer, key_name: str, marker: int, store_id: bytes
) -> None:
    """What a start reads before anything else, checked with `sealer` (its key: `key_name`): the
    key, the store's own rows (`meta`, identity, scenario), the chain's links and that its last
    tick is `meta`'s."""
    problem = key_mismatch(path, marker, sealer, key_name)
    if problem is not None:
        raise StoreError(problem)
    where = str(path)
    try:
        for key in ("store", "seal", "last_tick"):
            async with conn.execute(SELECT_META, (key,)) as cursor:
                row = await cursor.fetchone()
            if row is not None:
                _check_meta(sealer, tuple(row), where)
        for table, sql in (("run", SELECT_RUN), ("scenario", SELECT_SCENARIO)):
            async with conn.execute(sql) as cursor:
                row = await cursor.fetchone()
            if row is not None:
                sealer.check_row(table, tuple(row), where)
        await check_chain(conn, sealer, path, store_id)
        async with conn.execute(_LAST_TICKS) as cursor:
            last_tick, chained = await cursor.fetchone() or (None, None)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: reading its seals failed: {exc}") from exc
    _check_last_tick(where, last_tick, chained)


def _check_last_tick(where: str, last_tick: object, chained: object) -> None:
    if last_tick != chained:
        raise TamperError(f"{where}: its last tick is {last_tick} but its chain's is {chained}: it was edited "
                          "outside npcsim")


class _Groups:
    """The rows of one query ordered by link, taken a link at a time."""

    def __init__(self, rows: Iterator[tuple[Any, ...]], at: int) -> None:
        self._rows = rows
        self._at = at
        self._next = next(rows, None)

    def take(self, n: int, table: str, where: str) -> list[tuple[Any, ...]]:
        """The rows of link `n`; TamperError for a row of a link before it (none in the chain)."""
        found = []
        while self._next is not None and self._next[self._at] <= n:
            row = self._next
            if row[self._at] < n:
                raise TamperError(f"{where}: {describe(table, row)} names commit {row[self._at]}, which the chain "
                                  "does not have: it was added outside npcsim")
            found.append(row)
            self._next = next(self._rows, None)
        return found

    def left(self, table: str, where: str) -> None:
        if self._next is not None:
            raise TamperError(f"{where}: {describe(table, self._next)} names commit {self._next[self._at]}, after "
                              "the chain's last: it was added outside npcsim")


def _link_rows(groups: dict[str, _Groups], link: Link, sealer: Sealer | None, where: str) -> tuple[list[Any], ...]:
    """Link `link`'s records (id, digest; those rotated out too), inputs and world changes, each checked."""
    at = f"{where}: the chain breaks at {link.names()}"
    records = []
    for row in groups["audit"].take(link.n, "audit", at):
        if digest("audit", row[:-1]) != row[-1]:
            raise TamperError(f"{at}: {describe('audit', row)} does not match its digest: it was edited or added "
                              "outside npcsim")
        records.append((row[0], row[-1]))
    for row in groups["rotated"].take(link.n, "rotated", at):
        if sealer is not None:
            sealer.check_row("rotated", row, at)
        records.append((row[0], row[2]))
    records.sort()
    if any(a[0] == b[0] for a, b in itertools.pairwise(records)):
        raise TamperError(f"{at}: a record is both in the audit and rotated out: it was put back outside npcsim")
    inputs: list[Any] = []
    worlds: list[Any] = []
    for table, found, named in (("inputs", inputs, 2), ("world_changes", worlds, 1)):
        for row in groups[table].take(link.n, table, at):
            if sealer is not None:
                sealer.check_row(table, row, at)
            found.append((*row[:named], row[-1]))
    return records, inputs, worlds


def _check_counts(link: Link, records: list[Any], inputs: list[Any], worlds: list[Any], where: str) -> None:
    """The link's digest, its rows being each sound: what is missing, added or replaced."""
    if link_digest(records, inputs, worlds) == link.digest:
        return
    at = f"{where}: the chain breaks at {link.names()}"
    for what, have, wrote in (("record", len(records), link.records), ("input", len(inputs), link.inputs),
                              ("world change", len(worlds), link.worlds)):
        if have < wrote:
            raise TamperError(f"{at}: {wrote - have} of the {counted(wrote, what)} it wrote "
                              f"{'is' if wrote - have == 1 else 'are'} missing: deleted outside npcsim")
        if have > wrote:
            raise TamperError(f"{at}: it holds {counted(have - wrote, what)} more than it wrote: added outside npcsim")
    raise TamperError(f"{at}: its records or inputs are not the ones it wrote (one was replaced, its digest "
                      "computed again)")


def counted(n: int, noun: str) -> str:
    """"1 record", "2 records"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def verify_store(
    conn: sqlite3.Connection, path: Path, key: RunKey | None, key_name: str = "the run key"
) -> Verification:
    """Check the store on `conn` against its seals with `key` (where it comes from: `key_name`);
    TamperError (or StoreError for a key that is not the store's) names the first thing that
    does not verify."""
    where = str(path)
    meta = {str(k): (k, v, mac) for k, v, mac in conn.execute("SELECT key, value, mac FROM meta")}
    for name, what in (("store", "the store's own id"), ("seal", "the check value of its key")):
        if name not in meta:
            raise TamperError(f"{where}: {what} (meta {name!r}) is missing: it was edited outside npcsim")
    marker = int(meta["seal"][1])
    sealer: Sealer | None = Sealer(key)
    keyed = marker != Sealer().check
    if key is None and keyed:
        sealer = None  # only the digests and the heads can be checked
    elif key is not None and not keyed:
        raise TamperError(f"{where}: its seals say it was sealed without a run key, yet {key_name} is at hand: it "
                          "may have been sealed again without it")
    elif marker != Sealer(key).check:
        raise StoreError(f"{where} is sealed with another run key than {key_name}")
    for row in meta.values():
        _check_meta(sealer, row, where)
    for table, sql in (("run", SELECT_RUN), ("scenario", SELECT_SCENARIO)):
        for row in conn.execute(sql):
            if sealer is not None:
                sealer.check_row(table, row, where)
    groups = {table: _Groups(conn.execute(sql), _LINK_AT[table]) for table, sql in _CHAINED.items()}
    head, n, last_tick = genesis(bytes(meta["store"][1])), 0, None
    counts = {"records": 0, "rotated": 0, "inputs": 0, "world_changes": 0}
    for row in conn.execute(SELECT_LINKS):
        link = Link(*row)
        records, inputs, worlds = _link_rows(groups, link, sealer, where)
        _check_counts(link, records, inputs, worlds, where)
        check_link(head, n + 1, link, sealer, where)
        head, n, last_tick = link.head, link.n, link.tick if link.tick is not None else last_tick
        counts["records"] += len(records)
        counts["inputs"] += len(inputs)
        counts["world_changes"] += len(worlds)
    for table, group in groups.items():
        group.left(table, where)
    _check_last_tick(where, meta["last_tick"][1] if "last_tick" in meta else None, last_tick)
    (counts["rotated"],) = conn.execute("SELECT count(*) FROM rotated").fetchone()
    counts["records"] -= counts["rotated"]
    rows = 0 if sealer is None else _check_tables(conn, sealer, where)
    items = 0
    for k, body in conn.execute("SELECT k, body FROM items"):
        if item(bytes(body)).key != k:
            raise TamperError(f"{where}: item {k} does not match its digest: it was edited outside npcsim")
        items += 1
    return Verification(commits=n, last_tick=last_tick, **counts, rows=rows, items=items, head=head.hex(),
                        keyed=keyed, sealed=sealer is not None)


def _check_tables(conn: sqlite3.Connection, sealer: Sealer, where: str) -> int:
    """Every row of the sealed tables not read with the chain; how many."""
    rows = 0
    for table, (columns, _) in SEALED.items():
        if table in _CHAINED or table in ("meta", "run", "scenario"):
            continue
        for row in conn.execute(f"SELECT {', '.join(columns)}, mac FROM {table}"):
            sealer.check_row(table, row, where)
            rows += 1
    return rows
