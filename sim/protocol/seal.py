"""The run-key seal: an HMAC over internal messages, for brokers that enforce no ACL.

Internal topics (location events, inboxes, inference requests and replies) carry msgpack
that only the run's own processes should write. A broker's ACL is the first guard; where
there is none, every process of the run is given the same secret key (`--run-key-file`,
generated for `--broker auto`) and signs what it publishes:

    payload = b"NPK1" + HMAC-SHA256(key, topic + b"\\0" + body) + body

The topic is inside the MAC, so a signed message cannot be replayed on another topic; a
replay on the same topic is a duplicate the bus already drops. Sans-I/O: bytes in, bytes
out. Unsigned or badly signed messages are refused by `RunKey.open` (the caller counts
them), never parsed.

`seal` and `unseal` are the one way every component signs and opens a message: with no key
(a broker whose ACL is trusted) the body travels as it is.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from sim.errors import ConfigError

__all__ = ["MIN_KEY_BYTES", "RunKey", "load_run_key", "seal", "unchecked_body", "unseal"]

_MAGIC = b"NPK1"
_MAC = 32
MIN_KEY_BYTES = 16


class RunKey:
    """Signs and checks internal messages with one secret; `repr` never shows it."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"run key: {len(key)} bytes, need at least {MIN_KEY_BYTES}")
        self._key = key

    @classmethod
    def generate(cls) -> RunKey:
        return cls(secrets.token_hex(32).encode())

    @property
    def secret(self) -> bytes:
        """The key itself, to hand to the run's remote workers (a file of mode 0600)."""
        return self._key

    def _mac(self, topic: str, body: bytes) -> bytes:
        return hmac.new(self._key, topic.encode() + b"\0" + body, hashlib.sha256).digest()

    def sign(self, topic: str, body: bytes) -> bytes:
        return _MAGIC + self._mac(topic, body) + body

    def open(self, topic: str, payload: bytes) -> bytes | None:
        """The body of a correctly signed message for `topic`, or None."""
        if len(payload) < len(_MAGIC) + _MAC or not payload.startswith(_MAGIC):
            return None
        mac, body = payload[len(_MAGIC) : len(_MAGIC) + _MAC], payload[len(_MAGIC) + _MAC :]
        return body if hmac.compare_digest(mac, self._mac(topic, body)) else None

    def __repr__(self) -> str:
        return "RunKey(***)"


def load_run_key(path: str) -> RunKey:
    """Read `--run-key-file`: its bytes, surrounding whitespace removed; errors name the option."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"--run-key-file {path!r}: {exc.strerror or exc}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"--run-key-file {path!r}: {len(key)} bytes, need at least {MIN_KEY_BYTES}")
    return RunKey(key)


def seal(key: RunKey | None, topic: str, body: bytes) -> bytes:
    """The payload to publish on `topic`: the body, signed when the run has a key."""
    return body if key is None else key.sign(topic, body)


def unseal(key: RunKey | None, topic: str, payload: bytes) -> bytes | None:
    """The body of a payload received on `topic`; None when the run has a key and the signature fails."""
    return payload if key is None else key.open(topic, payload)


def unchecked_body(payload: bytes) -> bytes | None:
    """The body of a signed payload, its signature taken off and not checked; None when unsigned.

    For tools that read a run without its key (`npcsim subscribe --all`), never for trust.
    """
    if len(payload) < len(_MAGIC) + _MAC or not payload.startswith(_MAGIC):
        return None
    return payload[len(_MAGIC) + _MAC :]
