"""The sweep's process protocol: what a sweep process tells the parent, over a multiprocessing queue.

A process says `Ready` once its agents are generated and warmed, then a `Counted` about
four times a second while it runs and a `Done` when it stops (both carry what it counted
since its previous report), or `Failed` if it raised. Messages cross the queue as msgpack
bytes, encoded by one module-level encoder and decoded by one typed decoder, so the parent
reads typed values, never tuples or dicts whose shape is a convention.
"""

from __future__ import annotations

import msgspec

from sim.loadtest._stats import HistogramWire, ViolationRecord
from sim.loadtest._truncation import TallyWire

__all__ = ["Counted", "Done", "Failed", "Ready", "SweepCounts", "SweepMessage", "decode_message", "encode_message"]


class SweepCounts(msgspec.Struct, frozen=True, kw_only=True):
    """What one sweep process counted since its previous report.

    `violations` counts every broken invariant, `found` keeps the first few in full;
    `active_s` is how long the process's loop has run, by its own clock.
    """

    snapshots: int
    over_budget: int
    violations: int
    found: list[ViolationRecord]
    build: HistogramWire
    check: HistogramWire
    truncation: TallyWire
    active_s: float


class Ready(msgspec.Struct, frozen=True, kw_only=True, tag="ready"):
    """The process generated and warmed its agents and waits for the start."""

    process: int


class Counted(msgspec.Struct, frozen=True, kw_only=True, tag="counted"):
    """A report while the process runs."""

    process: int
    counts: SweepCounts


class Done(msgspec.Struct, frozen=True, kw_only=True, tag="done"):
    """The process's last report: it stopped (told to, or its quota was met)."""

    process: int
    counts: SweepCounts


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag="failed"):
    """The process raised; `error` names the exception."""

    process: int
    error: str


SweepMessage = Ready | Counted | Done | Failed

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(SweepMessage)


def encode_message(message: SweepMessage) -> bytes:
    return _ENCODER.encode(message)


def decode_message(data: bytes) -> SweepMessage:
    return _DECODER.decode(data)
