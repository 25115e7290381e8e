"""Decoders for bytes that came from outside the process: every failure is a `msgspec.DecodeError`.

msgspec raises `RecursionError`, not `DecodeError`, on nesting past the interpreter's stack,
and it does so even inside a field the target type ignores: a 2 KB payload of brackets is
enough. A reader that catches only `DecodeError` would let such a payload end its task (and a
run with it). Every decoder of outside bytes comes from here, so one `except
msgspec.DecodeError` covers every refusal, including the nested ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

__all__ = ["Reader", "json_reader", "msgpack_reader", "read_any_json", "read_any_msgpack"]

T = TypeVar("T")


class Reader(Generic[T]):
    """A typed decoder whose only failure is `msgspec.DecodeError` (ValidationError included)."""

    __slots__ = ("_decode",)

    def __init__(self, decode: Callable[[bytes], T]) -> None:
        self._decode = decode

    def decode(self, data: bytes) -> T:
        try:
            return self._decode(data)
        except RecursionError:
            raise msgspec.DecodeError(f"nested deeper than can be read ({len(data)} bytes)") from None


def json_reader(type_: type[T]) -> Reader[T]:
    return Reader(msgspec.json.Decoder(type_).decode)


def msgpack_reader(type_: type[T]) -> Reader[T]:
    return Reader(msgspec.msgpack.Decoder(type_).decode)


_any_json: Reader[Any] = Reader(msgspec.json.Decoder().decode)
_any_msgpack: Reader[Any] = Reader(msgspec.msgpack.Decoder().decode)


def read_any_json(data: bytes) -> Any:
    """Untyped JSON; raises msgspec.DecodeError."""
    return _any_json.decode(data)


def read_any_msgpack(data: bytes) -> Any:
    """Untyped msgpack; raises msgspec.DecodeError."""
    return _any_msgpack.decode(data)
