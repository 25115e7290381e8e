"""The chain: each commit's audit records, inputs and world change, digested, chained to the
commit before and sealed with the run key, in the commit's own transaction.

A commit that writes records, inputs or a world change, and every commit of a tick, adds a
link to `chain`: `n` (the commit's number, from 1), `tick` (the tick it committed; NULL for
a commit of no tick), how many records, inputs and world changes it wrote, `digest`
(BLAKE2b-256 of the records' digests by id, the inputs' MACs by (tick, seq) and the world
change's), `head` (BLAKE2b-256 of the previous head, `n`, `tick`, the counts and the
digest; the first link's previous head is made from the store's `meta.store`) and `seal`
(the head, keyed: sim.store.seals). Every such row carries `link` = n under its digest or
MAC, so a row cannot be moved to another commit unseen.

A rotation (sim.store._rotate) deletes exported records and keeps each one's id, link and
digest in `rotated`, sealed: the link they belonged to still verifies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import aiosqlite
import msgspec

from sim.errors import StoreError, TamperError
from sim.store.seals import Sealer, digest
from sim.store.sql import BLOB_LAST, BULK, CHAINED, INSERT, SET_LAST_TICK, TABLES, RowKind

__all__ = ["INSERT_LINK", "LAST_LINK", "SELECT_LINKS", "ChainEnd", "Link", "Seals", "check_chain", "check_link",
           "genesis", "link_digest", "next_head", "seal_rows"]

_ENCODER = msgspec.msgpack.Encoder()
_ENCODER_JSON = msgspec.json.Encoder()

SELECT_LINKS = "SELECT n, tick, records, inputs, worlds, digest, head, seal FROM chain ORDER BY n"
LAST_LINK = "SELECT n, tick, records, inputs, worlds, digest, head, seal FROM chain ORDER BY n DESC LIMIT 1"
INSERT_LINK = "INSERT INTO chain (n, tick, records, inputs, worlds, digest, head, seal) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
# The ids of a batch's records inserted in the open transaction (when some were not: an id
# already held keeps its record, and its older link).
_KEPT_RECORDS = "SELECT id FROM audit WHERE link = ? AND id IN (SELECT value FROM json_each(?))"


class Link(NamedTuple):
    """One row of `chain`."""

    n: int
    tick: int | None
    records: int
    inputs: int
    worlds: int
    digest: bytes
    head: bytes
    seal: bytes

    def names(self) -> str:
        """"tick 5 (commit 7)", or "commit 7 (no tick)"."""
        return f"commit {self.n} (no tick)" if self.tick is None else f"tick {self.tick} (commit {self.n})"


def genesis(store_id: bytes) -> bytes:
    """The head before the first link: the store's own, so no other store's chain fits it."""
    return hashlib.blake2b(store_id, digest_size=32, person=b"chain genesis").digest()


def link_digest(records: Sequence[tuple[str, int]], inputs: Sequence[tuple[int, int, int]],
                worlds: Sequence[tuple[int, int]]) -> bytes:
    """What a commit wrote: records (id, digest) by id, inputs (tick, seq, mac) by (tick, seq),
    world changes (tick, mac) by tick."""
    return hashlib.blake2b(_ENCODER.encode((records, inputs, worlds)), digest_size=32, person=b"chain link").digest()


def next_head(previous: bytes, n: int, tick: int | None, counts: tuple[int, int, int], digest: bytes) -> bytes:
    return hashlib.blake2b(_ENCODER.encode((previous, n, tick, *counts, digest)), digest_size=32,
                           person=b"chain head").digest()


def check_link(previous: bytes, n: int, link: Link, sealer: Sealer | None, where: str) -> None:
    """The link numbered `n` follows the head `previous` and (unless `sealer` is None: the key
    is not at hand) its seal verifies; TamperError naming it otherwise."""
    if link.n != n:
        raise TamperError(f"{where}: the chain breaks at commit {n}: it is missing (the next is commit {link.n})")
    if next_head(previous, link.n, link.tick, (link.records, link.inputs, link.worlds), link.digest) != link.head:
        raise TamperError(f"{where}: the chain breaks at {link.names()}: its head does not follow from the "
                          "commit before (the chain was edited)")
    if sealer is not None and sealer.seal(link.head) != link.seal:
        key = " with the run key" if sealer.keyed else ""
        raise TamperError(f"{where}: the chain breaks at {link.names()}: its seal does not verify{key}")


async def check_chain(conn: aiosqlite.Connection, sealer: Sealer, path: Path, store_id: bytes) -> Link | None:
    """Every link's head and seal (not the rows they digest: `npcsim audit verify` reads those);
    the last link."""
    head, last = genesis(store_id), None
    async with conn.execute(SELECT_LINKS) as cursor:
        async for row in cursor:
            link = Link(*row)
            check_link(head, 1 if last is None else last.n + 1, link, sealer, str(path))
            head, last = link.head, link
    return last


class ChainEnd:
    """The chain's end as the writer extends it: what the open transaction wrote, then its link."""

    __slots__ = ("head", "inputs", "n", "records", "worlds")

    def __init__(self, last: Link | None, store_id: bytes) -> None:
        self.n = 1 if last is None else last.n + 1  # the open transaction's link
        self.head = genesis(store_id) if last is None else last.head
        self.records: dict[str, int] = {}
        self.inputs: dict[tuple[int, int], int] = {}
        self.worlds: dict[int, int] = {}

    def kept(self, rows: Iterable[tuple[Any, ...]], inserted: Iterable[str] | None = None) -> None:
        """Of the audit rows just run, those the database inserted (`inserted`: their ids, None
        for all; an id it held already is ignored: the first record of an inference id wins)
        join the link."""
        digests: dict[str, int] = {}
        for row in rows:
            digests.setdefault(row[0], row[-2])
        for record_id in digests if inserted is None else inserted:
            self.records.setdefault(record_id, digests[record_id])

    def link(self, tick: int | None, sealer: Sealer) -> Link | None:
        """The open transaction's link; None for a commit of no tick that wrote nothing chained."""
        if tick is None and not (self.records or self.inputs or self.worlds):
            return None
        counts = (len(self.records), len(self.inputs), len(self.worlds))
        digest = link_digest(sorted(self.records.items()), [(*k, m) for k, m in sorted(self.inputs.items())],
                             sorted(self.worlds.items()))
        head = next_head(self.head, self.n, tick, counts, digest)
        return Link(self.n, tick, *counts, digest, head, sealer.seal(head))

    def advance(self, link: Link | None) -> None:
        """The transaction committed with `link`."""
        if link is not None:
            self.n, self.head = link.n + 1, link.head
        self.records.clear()
        self.inputs.clear()
        self.worlds.clear()


def seal_rows(rows: dict[RowKind, list[tuple[Any, ...]]], sealer: Sealer, chain: ChainEnd) -> None:
    """Give each row its `mac` (an audit row its `link` and `digest`, an input or world change its
    `link` too), in place; the inputs' and world changes' MACs go into the open link (the
    records', once the database says which it kept: `ChainEnd.kept`)."""
    link = chain.n
    for kind, group in rows.items():
        table = TABLES.get(kind)
        if table is None:
            continue
        if kind == "audit":
            rows[kind] = [(*r[:-1], link, digest("audit", (*r[:-1], link, r[-1])), r[-1]) for r in group]
            continue
        if kind in CHAINED:
            group = [(*r, link) for r in group]
        mac = sealer.mac
        if kind in BLOB_LAST:
            rows[kind] = [(*r[:-1], mac(table, r), r[-1]) for r in group]
            continue
        sealed = rows[kind] = [(*r, mac(table, r)) for r in group]
        if kind == "input":
            chain.inputs.update(((tick, seq), m) for tick, seq, _, _, m in sealed)
        elif kind == "world_change":
            chain.worlds.update((tick, m) for tick, _, _, m in sealed)


class Seals:
    """The writer's seals: the key (`sealer`) and the chain's end."""

    __slots__ = ("_keyed", "_mark", "_path", "_sealer", "chain")

    def __init__(self, path: Path, chain: ChainEnd, marker: int) -> None:
        self._path = path
        self.chain = chain
        self._keyed = marker != Sealer().check  # `meta.seal`: the store is sealed with a run key
        self._mark = False  # `meta.seal` is to say the key given
        self._sealer = Sealer()  # the run key's, once `Store.seal_with` gives it

    @property
    def sealer(self) -> Sealer:
        """What rows are sealed and checked with: a store sealed with a run key is used only with it."""
        self.check_key()
        return self._sealer

    def check_key(self) -> None:
        if self._keyed and not self._sealer.keyed:
            raise StoreError(f"{self._path}: the store is sealed with a run key: give it (Store.seal_with) first")

    def use(self, sealer: Sealer, *, mark: bool = False) -> None:
        """Seal with `sealer` from now on; `mark`: a store nothing was written to takes its key,
        said in `meta.seal` with the next commit."""
        self._sealer = sealer
        self._mark = mark

    def seal(self, rows: dict[RowKind, list[tuple[Any, ...]]]) -> None:
        seal_rows(rows, self._sealer, self.chain)

    async def insert_records(
        self, conn: aiosqlite.Connection, group: list[tuple[Any, ...]], parameters: tuple[bytes, ...] | None
    ) -> None:
        """Insert sealed audit rows (`parameters`: the bulk statement's, None for one at a time);
        those inserted join the open link: all of them, unless the database says it inserted
        fewer (an id it held already), when it is asked which."""
        inserted = 0
        if parameters is None:
            for row in group:
                async with conn.execute(INSERT["audit"], row) as cursor:
                    inserted += cursor.rowcount
        else:
            async with conn.execute(BULK["audit"], parameters) as cursor:
                inserted = cursor.rowcount
        ids = list(dict.fromkeys(row[0] for row in group))
        if inserted == len(ids):
            self.chain.kept(group)
            return
        async with conn.execute(_KEPT_RECORDS, (self.chain.n, _ENCODER_JSON.encode(ids))) as cursor:
            self.chain.kept(group, [record_id for (record_id,) in await cursor.fetchall()])

    def link(self, tick: int | None) -> Link | None:
        """The open transaction's link, when its commit makes one (`ChainEnd.link`)."""
        return self.chain.link(tick, self._sealer)

    async def end(self, conn: aiosqlite.Connection, link: Link | None) -> None:
        """In the open transaction, before its commit: its link, the tick it commits, the key taken."""
        if link is not None:
            await conn.execute(INSERT_LINK, link)
            if link.tick is not None:
                await conn.execute(SET_LAST_TICK, (link.tick, self._sealer.mac("meta", ("last_tick", link.tick))))
        if self._mark:
            check = self._sealer.check
            await conn.execute(INSERT["meta"], ("seal", self._sealer.mac("meta", ("seal", check)), check))
            self._mark = False

    def committed(self, link: Link | None) -> None:
        self.chain.advance(link)
