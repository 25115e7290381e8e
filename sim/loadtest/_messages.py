"""The sweep's process protocol: what the parent and a sweep process tell each other, in frames (`sim.helper`).

The parent sends a `SweepSetup` first (the process answers `sim.wire.local.Hello`). The
process says `Ready` once its agents are generated and warmed, then a `Counted` about four
times a second while it runs and a `Done` when it stops (both carry what it counted since
its previous report), or `Failed` if it raised. The parent says `Start` once, and `Stop`
when the phase is over (the end of the process's input stops it too). Messages are msgpack,
encoded by one module-level encoder and decoded by one typed decoder per direction, so each
side reads typed values, never tuples or dicts whose shape is a convention.
"""

from __future__ import annotations

import msgspec

from sim.loadtest._stats import HistogramWire, ViolationRecord
from sim.loadtest._truncation import TallyWire
from sim.memory import WorkingMemoryConfig

__all__ = [
    "Counted",
    "Done",
    "Failed",
    "Ready",
    "Start",
    "Stop",
    "SweepCounts",
    "SweepJob",
    "SweepMessage",
    "SweepOrder",
    "SweepSetup",
    "decode_message",
    "decode_order",
    "decode_setup",
    "encode_message",
]


class SweepJob(msgspec.Struct, frozen=True, kw_only=True):
    """What one sweep process is told: its share, the phase's budget, its quota."""

    index: int
    processes: int
    agents: int
    seed: int
    sizing_chars: int
    memory: WorkingMemoryConfig
    quota: int | None


class SweepSetup(msgspec.Struct, frozen=True, kw_only=True):
    """What a sweep process is started with: its job; the builder and checker, pickled (any
    module-level functions, as a process pool would take them); and the parent's import
    path, so that they import in the process as they do in the parent."""

    job: SweepJob
    functions: bytes
    path: list[str]


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


class Start(msgspec.Struct, frozen=True, kw_only=True, tag="start"):
    """The phase's clock started: build and check."""


class Stop(msgspec.Struct, frozen=True, kw_only=True, tag="stop"):
    """The phase is over: report what is left and end."""


SweepOrder = Start | Stop

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(SweepMessage)
_ORDER: msgspec.msgpack.Decoder[SweepOrder] = msgspec.msgpack.Decoder(SweepOrder)
_SETUP = msgspec.msgpack.Decoder(SweepSetup)


def encode_message(message: SweepMessage | SweepOrder | SweepSetup) -> bytes:
    return _ENCODER.encode(message)


def decode_message(data: bytes) -> SweepMessage:
    return _DECODER.decode(data)


def decode_order(data: bytes) -> SweepOrder:
    return _ORDER.decode(data)


def decode_setup(data: bytes) -> SweepSetup:
    return _SETUP.decode(data)
