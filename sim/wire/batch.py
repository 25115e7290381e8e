"""Many messages in one payload: the batch framing of the inference transport.

One MQTT message per request caps the remote path at the broker's per-message cost, so
requests and replies travel many to a message (`sim.inference` decides when a batch goes).
A batch is a msgpack array of the single messages' maps, whatever their type; a payload
holding one map (a single message, as older peers send it) is read as a batch of one. A
malformed element costs only itself: the others of its batch are still read. An empty array
is malformed (no peer sends one), so a reader counts it instead of dropping it unseen.

Not to be confused with `sim.wire.events.EventBatch`, which is one message: a tick's
events at one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec

from sim.wire.decoding import msgpack_reader

__all__ = ["decode_batch", "encode_batch"]

S = TypeVar("S", bound=msgspec.Struct)

_encoder = msgspec.msgpack.Encoder()
_raw_list = msgpack_reader(list[msgspec.Raw])


def encode_batch(items: Sequence[msgspec.Struct]) -> bytes:
    return _encoder.encode(items)


def decode_batch(payload: bytes, decode: Callable[[bytes], S]) -> tuple[list[S], list[msgspec.DecodeError]]:
    """Every well-formed element of a batch (each read by `decode`), and one error per malformed element.

    Never raises: a payload that is neither an array nor a single message is one error.
    """
    try:
        raws = _raw_list.decode(payload)
    except msgspec.DecodeError:
        try:
            return [decode(payload)], []
        except msgspec.DecodeError as exc:
            return [], [exc]
    if not raws:
        return [], [msgspec.DecodeError("an empty batch")]
    items: list[S] = []
    errors: list[msgspec.DecodeError] = []
    for raw in raws:
        try:
            items.append(decode(bytes(raw)))
        except msgspec.DecodeError as exc:
            errors.append(exc)
    return items, errors
