"""Resume metadata: what an exact `--resume` needs besides the agents' state.

The last tick committed with `end_tick` is `meta`'s `last_tick` (the writer records it
with each tick's commit, `read_last_tick` reads it when the store opens). What a tick
replaces (`keep(TickRecord)`: what the shard sent in its last two committed ticks, the
`say` messages the broker had not acknowledged, what waits for the next tick: the mail in
its NPCs' inboxes and the world-state changes due), the outside inputs with the tick they
take effect at (`record_input`) and the world-state changes with the tick they took effect
at (`record_world`) are queued rows, so they are on disk exactly when their tick is.
What is read back is checked against its seal (sim.store.seals) first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import msgspec

from sim.errors import StoreError
from sim.store._writer import BatchWriter
from sim.store.sql import SELECT_ALL_INPUTS, SELECT_INPUTS, SELECT_LAST_TICK, SELECT_META, fetch
from sim.wire.events import AnyEvent
from sim.wire.inputs import GameFact, RunWide, Taken

__all__ = ["Pending", "Resume", "TickRecord", "decode_taken", "read_last_tick"]


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """What waits for the tick after the last committed one, besides the places' logs."""

    mail: list[tuple[str, AnyEvent]] = []  # (agent, event) waiting in inboxes
    world: dict[str, str] | None = None  # world-state changes that take effect then
    run_wide: tuple[RunWide, ...] = ()  # presence and facts for every NPC taken then (shard 0's TickDone)
    presence: dict[str, str] = {}  # where each outside player stands
    overrides: dict[str, tuple[str, str, int]] = {}  # NPC -> (place, activity, tick): moved off its routine
    moves: list[tuple[str, str]] = []  # (npc, place) chosen in that tick, applied in the next
    arrivals: dict[str, int] = {}  # this shard's NPCs that arrived where they stand off their routine, when


class TickRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a tick's commit replaces besides its rows: what the shard keeps for re-sending
    (tick, topic, payload), the `say` messages the broker has not acknowledged (topic,
    payload: a resumed shard sends them again), and what waits for the next tick."""

    sent: list[tuple[int, str, bytes]]
    says: list[tuple[str, bytes]]
    pending: Pending


_T = TypeVar("_T")

_encoder = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()
_sent_decoder = msgspec.msgpack.Decoder(list[tuple[int, str, bytes]])
_says_decoder = msgspec.msgpack.Decoder(list[tuple[str, bytes]])
_pending_decoder = msgspec.msgpack.Decoder(Pending)
_taken_decoder = msgspec.json.Decoder(Taken)


def decode_taken(text: str | bytes) -> Taken:
    """An outside input as the `inputs` table holds it (JSON, tagged by `type`)."""
    return _taken_decoder.decode(text)


async def read_last_tick(conn: aiosqlite.Connection) -> int | None:
    async with conn.execute(SELECT_LAST_TICK) as cursor:
        row = await cursor.fetchone()
    return None if row is None else int(row[0])


class Resume:
    """Writes resume metadata through the writer and reads back what was committed."""

    __slots__ = ("_conn", "_path", "_writer")

    def __init__(self, conn: aiosqlite.Connection, path: Path, writer: BatchWriter) -> None:
        self._conn = conn
        self._path = path
        self._writer = writer

    async def record_input(self, tick: int, taken: Taken) -> None:
        """Queue one outside input as taking effect at `tick` (committed with that tick)."""
        await self._writer.put("input", (tick, taken.seq, _json.encode(taken).decode()))

    async def record_world(self, tick: int, state: dict[str, str]) -> None:
        """Queue the world-state change that took effect at `tick` (committed with that tick)."""
        await self._writer.put("world_change", (tick, _json.encode(state).decode()))

    async def _inputs(self, sql: str, params: tuple[int, ...]) -> list[Any]:
        """Inputs rows (tick, seq, input, link, mac), each checked."""
        rows = list(await fetch(self._conn, sql, params))
        self._writer.sealer.check_rows("inputs", rows, str(self._path))
        return rows

    async def inputs(self, tick: int) -> list[Taken]:
        """The committed outside inputs of `tick`, in seq order."""
        rows = await self._inputs(SELECT_INPUTS, (tick,))
        try:
            return [decode_taken(text) for _, _, text, _, _ in rows]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{self._path}: unreadable: an outside input of tick {tick}: {exc}") from exc

    async def run_wide_facts(self) -> set[str]:
        """The ids of the facts for every NPC the committed ticks took, less those withdrawn since."""
        rows = await self._inputs(SELECT_ALL_INPUTS, ())
        try:
            taken = [decode_taken(text) for _, _, text, _, _ in rows]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{self._path}: unreadable: an outside input: {exc}") from exc
        held: set[str] = set()
        for t in taken:
            if isinstance(t, GameFact) and t.npc is None:
                if t.action == "add":
                    held.add(t.id)
                elif t.action == "withdraw":
                    held.discard(t.id)
        return held

    async def keep(self, record: TickRecord) -> None:
        """Queue what the tick replaces: what was sent, the unacknowledged says, what is pending."""
        await self._writer.put("meta", ("sent", _encoder.encode(record.sent)))
        await self._writer.put("meta", ("says", _encoder.encode(record.says)))
        await self._writer.put("meta", ("pending", _encoder.encode(record.pending)))

    async def sent(self) -> list[tuple[int, str, bytes]]:
        """What the shard kept for re-sending at its last commit: (tick, topic, payload)."""
        return await self._read("sent", _sent_decoder, "the kept messages of the last tick") or []

    async def says(self) -> list[tuple[str, bytes]]:
        """The `say` messages unacknowledged when the last tick committed."""
        return await self._read("says", _says_decoder, "the unsent lines of the last tick") or []

    async def pending(self) -> Pending:
        """What waited for the tick after the last commit."""
        return await self._read("pending", _pending_decoder, "what waits for the next tick") or Pending()

    async def _read(self, key: str, decoder: msgspec.msgpack.Decoder[_T], what: str) -> _T | None:
        """One `meta` value, checked and decoded; None when there is none."""
        rows = list(await fetch(self._conn, SELECT_META, (key,)))
        if not rows:
            return None
        self._writer.sealer.check_row("meta", rows[0], str(self._path))
        try:
            return decoder.decode(rows[0][1])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{self._path}: unreadable: {what}: {exc}") from exc
