"""The tick barrier's wire messages (`barrier/{shard}`, msgpack): TickDone, Start, Join, Hello and Welcome.

The bookkeeping that reads TickDone, Start and Join is `sim.protocol.barrier`; Hello and Welcome
are how a shard that starts without the run's nonce learns it from shard 0
(sim.protocol.seal, sim.shard._instance).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from sim.wire.decoding import Reader
from sim.wire.events import Name
from sim.wire.inputs import RunWide

__all__ = ["BarrierMessage", "Hello", "Join", "Start", "TickDone", "Welcome", "decode_barrier", "encode_barrier"]

_Tick = Annotated[int, msgspec.Meta(ge=0)]
_Shard = Annotated[str, msgspec.Meta(min_length=1, max_length=16, pattern=r"^[0-9]+$")]
_Hex = Annotated[str, msgspec.Meta(min_length=32, max_length=32, pattern=r"^[0-9a-f]+$")]


class TickDone(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="done", tag_field="type"):
    """Shard `shard` finished `tick`; `batches` maps each topic it published to for that tick
    to the number of events in that batch (one batch per topic and tick).

    Shard 0 alone takes what every shard applies: `world` carries the game system's
    world-state changes it took during `tick`, `inputs` the players' presence and the facts
    for every NPC, in the order taken; every shard applies them at tick + 1, the same tick
    everywhere.
    """

    shard: _Shard
    shards: Annotated[int, msgspec.Meta(ge=1)]
    tick: _Tick
    batches: dict[str, Annotated[int, msgspec.Meta(ge=0)]]
    world: dict[str, str] | None = None
    inputs: tuple[RunWide, ...] = ()
    moves: tuple[tuple[Name, Name], ...] = ()
    """The moves the shard's NPCs chose in `tick` (npc, place: `go_to`), applied at tick + 1 everywhere."""


class Start(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="start", tag_field="type"):
    """Shard `shard` begins `tick` now, before the run's pace (`tick_ms`): outside input
    waits for that tick there. Every shard that receives it begins `tick` as soon as its
    barrier for the tick before passed, so the shards step together. Only the time changes:
    what a tick takes is what the arrivals journal stamped, so a lost Start costs latency,
    never an input."""

    shard: _Shard
    shards: Annotated[int, msgspec.Meta(ge=1)]
    tick: _Tick


class Join(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="join", tag_field="type"):
    """Shard `shard` is (again) listening and needs what was sent for ticks >= `tick`.

    (`session`, `seq`) names this Join: the shard's process (random at its start) and its
    count of Joins, so a peer serves each Join once however often it is replayed.
    """

    shard: _Shard
    shards: Annotated[int, msgspec.Meta(ge=1)]
    tick: _Tick
    session: Annotated[str, msgspec.Meta(max_length=32)] = ""
    seq: Annotated[int, msgspec.Meta(ge=0)] = 0


class Hello(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="hello", tag_field="type"):
    """Shard `shard` starts without the run's nonce and asks shard 0 for it; `challenge` is
    fresh and random, and only a Welcome that echoes it is believed. Sealed with the
    unbound nonce (sim.protocol.seal.UNBOUND), the one message that may be."""

    shard: _Shard
    shards: Annotated[int, msgspec.Meta(ge=1)]
    challenge: _Hex


class Welcome(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="welcome",
              tag_field="type"):
    """Shard 0's answer to the Hello with `challenge`: the run's `nonce` (hex), sealed with it."""

    shard: _Shard
    shards: Annotated[int, msgspec.Meta(ge=1)]
    challenge: _Hex
    nonce: _Hex


BarrierMessage = TickDone | Start | Join | Hello | Welcome

_encoder = msgspec.msgpack.Encoder()
_decoder: Reader[BarrierMessage] = Reader(msgspec.msgpack.Decoder(BarrierMessage).decode)


def encode_barrier(message: BarrierMessage) -> bytes:
    return _encoder.encode(message)


def decode_barrier(data: bytes) -> BarrierMessage:
    """Raises msgspec.DecodeError (or ValidationError) on a malformed payload."""
    return _decoder.decode(data)
