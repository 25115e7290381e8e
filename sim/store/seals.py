"""Seals: what makes an edit of a store, made outside npcsim, show.

Every row of a table a resumed shard reads carries `mac`, a keyed BLAKE2b-64 (a MAC, as an
HMAC would be) of its table's name and its other columns, which the writer task computes
as it writes the row and every load checks: an edited or an injected row (a belief, a
fact, a world entry, an input, what waits for the next tick) is refused in one line naming
its table and row. The key is derived from the run key (sim.protocol.seal): the one kept
beside the store for `--broker auto` (`RUN.db.key`), or `--run-key-file`. A store written
without a run key gets the same digests with an empty key: they catch an accidental edit,
never a forger who computes them again.

The audit is chained besides (sim.store._chain): each audit row carries `digest`, the
same digest unkeyed (so a record edited by hand shows without the key too), and `link`,
the commit that wrote it; so do `inputs` and `world_changes` rows (`link` beside their
`mac`).

`meta` holds two rows of its own: `store`, 16 random bytes given to the store when it is
made (where its chain and its arrivals journal begin, so neither can be taken from another
store of the same run), and `seal`, the key's check value (`Sealer.check`): no key's when
the store is made, the run key's once a store nothing was written to is given one
(`Store.seal_with`). A store sealed with one key is never resumed or rotated with another.

Public, like `sim.store.sql` and `sim.store.records`: the seals are part of the store's
format (docs/store.md), and a tool that writes rows as the store does must seal them so.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence

import msgspec

from sim.errors import TamperError
from sim.protocol.seal import RunKey

__all__ = ["AUDIT_DIGEST", "SEALED", "Sealer", "describe", "digest"]

_ENCODER = msgspec.msgpack.Encoder()
_CONTEXT = b"npcsim store seal"
_NAME_CHARS = 40

SEALED: dict[str, tuple[tuple[str, ...], int]] = {
    "meta": (("key", "value"), 1),
    "run": (("identity",), 0),
    "scenario": (("sha256", "data"), 0),
    "agents": (("agent", "system_prompt"), 1),
    "agent_keys": (("n", "agent"), 2),
    "facts": (("agent", "id", "text", "writer", "withdrawn"), 2),
    "world": (("agent", "key", "value", "writer"), 2),
    "heard": (("agent", "tick", "items"), 2),
    "place_events": (("place", "tick", "items"), 2),
    "place_windows": (("place", "since"), 1),
    "kept": (("agent", "slot", "body"), 2),
    "summaries": (("place", "slot", "events", "body"), 2),
    "beliefs": (("agent", "id", "tick", "text", "confidence"), 2),
    "dialogue": (("agent", "tick", "seq", "speaker", "text", "event"), 3),
    "inputs": (("tick", "seq", "input", "link"), 2),
    "world_changes": (("tick", "state", "link"), 1),
    "rotated": (("id", "link", "digest"), 1),
}
"""Each sealed table: the columns its `mac` covers, in the order the writer gives them, and
how many of the first name a row in a refusal."""

AUDIT_DIGEST = (("id", "run_id", "agent", "tick", "backend", "model", "fallback", "line", "link", "record"), 1)
"""The columns an audit row's `digest` covers (every one but the digest itself)."""


class _Macs(dict[str, "hashlib.blake2b"]):
    """A keyed BLAKE2b-64 per table, its key and person set once: a copy of it hashes a row
    (a third cheaper than a new one per row, and the writer seals every row)."""

    def __init__(self, key: bytes) -> None:
        super().__init__()
        self._key = key

    def __missing__(self, table: str) -> hashlib.blake2b:
        made = self[table] = hashlib.blake2b(digest_size=8, key=self._key, person=table.encode())
        return made

    def mac(self, table: str, values: Sequence[object]) -> int:
        h = self[table].copy()
        h.update(_ENCODER.encode(values))
        return int.from_bytes(h.digest(), "big", signed=True)


_DIGESTS = _Macs(b"")


def digest(table: str, values: Sequence[object]) -> int:
    """A row's unkeyed digest: what an audit row carries, and every `mac` of a store without a key."""
    return _DIGESTS.mac(table, values)


class Sealer:
    """Seals rows, chain heads and journal records with one key; `repr` never shows it."""

    __slots__ = ("_key", "_macs", "check", "keyed")

    def __init__(self, key: RunKey | None = None) -> None:
        self.keyed = key is not None
        self._key = b"" if key is None else hmac.new(key.secret, _CONTEXT, hashlib.sha256).digest()
        self._macs = _Macs(self._key)
        self.check = self.mac("key", ())
        """The key's check value: which key sealed a store, saying nothing of the key."""

    def mac(self, table: str, values: Sequence[object]) -> int:
        """The `mac` of a row of `table` whose sealed columns hold `values`."""
        return self._macs.mac(table, values)

    def seal(self, head: bytes) -> bytes:
        """The seal of a chain head."""
        return hashlib.blake2b(head, digest_size=32, key=self._key, person=b"chain seal").digest()

    def journal(self, previous: bytes, body: bytes) -> bytes:
        """The MAC of an arrivals record, chained to the one before it."""
        return hashlib.blake2b(previous + body, digest_size=16, key=self._key, person=b"arrivals").digest()

    def check_row(self, table: str, row: Sequence[object], where: str) -> None:
        """`row` is a sealed row's columns (`SEALED[table]`) and then its `mac`; TamperError unless they match."""
        self.check_rows(table, (row,), where)

    def check_rows(self, table: str, rows: Iterable[Sequence[object]], where: str) -> None:
        """`check_row` for many rows of one table (a load checks thousands: one loop, no call per row)."""
        base, encode, from_bytes = self._macs[table], _ENCODER.encode, int.from_bytes
        for row in rows:
            h = base.copy()
            h.update(encode(row[:-1]))
            if from_bytes(h.digest(), "big", signed=True) != row[-1]:
                raise TamperError(f"{where}: {describe(table, row)} does not match its seal: "
                                  "it was edited or added outside npcsim")

    def __repr__(self) -> str:
        return f"Sealer({'keyed' if self.keyed else 'no key'})"


def describe(table: str, row: Sequence[object]) -> str:
    """A row named by its first columns, for one line: `beliefs row (agent 'innkeeper', id 'b3')`."""
    if table == "audit":
        return f"record {_short(row[0])}"
    columns, naming = SEALED[table]
    if naming == 0:
        return {"run": "the run identity", "scenario": "the scenario's text"}[table]
    named = ", ".join(f"{column} {_short(value)}" for column, value in zip(columns[:naming], row, strict=False))
    return f"{table} row ({named})"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _NAME_CHARS else text[: _NAME_CHARS - 1] + "…"
