"""The tick barrier's wire messages (`barrier/{shard}`, msgpack): TickDone and Join.

The bookkeeping that reads them is `sim.protocol.barrier`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["BarrierMessage", "Join", "TickDone", "decode_barrier", "encode_barrier"]

_Tick = Annotated[int, msgspec.Meta(ge=0)]
_Shard = Annotated[str, msgspec.Meta(min_length=1, max_length=16, pattern=r"^[0-9]+$")]


class TickDone(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="done", tag_field="type"):
    """Shard `shard` finished `tick`; `batches` maps each topic it published to for that tick
    to the number of events in that batch (one batch per topic and tick).

    Shard 0 alone takes the game system's world-state changes; `world` carries those it
    took during `tick`, and every shard applies them at tick + 1, the same tick everywhere.
    """

    shard: _Shard
    shards: Annotated[int, msgspec.Meta(ge=1)]
    tick: _Tick
    batches: dict[str, Annotated[int, msgspec.Meta(ge=0)]]
    world: dict[str, str] | None = None


class Join(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="join", tag_field="type"):
    """Shard `shard` is (again) listening and needs what was sent for ticks >= `tick`."""

    shard: _Shard
    shards: Annotated[int, msgspec.Meta(ge=1)]
    tick: _Tick


BarrierMessage = TickDone | Join

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(BarrierMessage)


def encode_barrier(message: BarrierMessage) -> bytes:
    return _encoder.encode(message)


def decode_barrier(data: bytes) -> BarrierMessage:
    """Raises msgspec.DecodeError (or ValidationError) on a malformed payload."""
    return _decoder.decode(data)
