"""The run-key seal: an HMAC over internal messages, bound to one run instance.

Internal topics (location events, inboxes, barrier messages, inference requests and
replies) carry msgpack that only the run's own processes should write. A broker's ACL is
the first guard; where there is none, every process of the run is given the same secret
key (`--run-key-file`, or the key `--broker auto` keeps next to the store) and signs what
it publishes:

    payload = b"NPK2" + nonce + HMAC-SHA256(key, b"NPK2" + nonce + topic + b"\\0" + body) + body

The topic is inside the MAC, so a signed message cannot be replayed on another topic; a
replay on the same topic within the run is a duplicate the bus already drops. The `nonce`
(16 bytes) is the run's: chosen at random by shard 0 at the run's first start and kept in
every shard's store (sim.store.RunIdentity), so a resume keeps it, and another run with
the same run id and key file has another one. A message of that other run has a valid MAC
but the wrong nonce: it is refused as "sealed for another run", never parsed.

How the shards of a run come to share the nonce (sim.shard._instance): shard 0 chooses it
at its first start; every shard stores it; a shard that starts for the first time without
it asks shard 0 with a `Hello` carrying a fresh random challenge, sealed with the `UNBOUND`
nonce (only a Hello may travel so), and takes the nonce from the `Welcome` that echoes its
challenge, sealed with that nonce. A Welcome recorded in an earlier run echoes a challenge
nobody asks again, so replaying it teaches nothing.

A key without a nonce (`RunKey(secret)`, what `npcsim worker` holds) opens messages of any
instance of the run and answers each sealed for the instance that asked (`for_run`); only
shards are bound. Sans-I/O: bytes in, bytes out. `seal` and `unseal` are the one way every
component signs and opens a message: with no key (a broker whose ACL is trusted) the body
travels as it is (a message body never starts with the magic: msgpack maps and arrays do not).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from sim.errors import ConfigError

__all__ = [
    "MIN_KEY_BYTES",
    "NONCE_BYTES",
    "OTHER_RUN",
    "UNBOUND",
    "UNSIGNED",
    "RunKey",
    "load_run_key",
    "new_nonce",
    "refusal",
    "run_key_of",
    "seal",
    "sealed_nonce",
    "unchecked_body",
    "unseal",
]

_MAGIC = b"NPK2"
_MAC = 32
NONCE_BYTES = 16
_HEADER = len(_MAGIC) + NONCE_BYTES + _MAC
MIN_KEY_BYTES = 16
UNBOUND = bytes(NONCE_BYTES)
"""The nonce of a shard that does not know the run's yet: only its `Hello` is sealed so."""

UNSIGNED = "unsigned internal message"
OTHER_RUN = "sealed for another run"


def new_nonce() -> bytes:
    """A fresh run nonce (never `UNBOUND`)."""
    while (nonce := secrets.token_bytes(NONCE_BYTES)) == UNBOUND:
        continue
    return nonce


class RunKey:
    """Signs and checks internal messages with one secret, for one run nonce; `repr` never shows either."""

    __slots__ = ("_key", "_nonce")

    def __init__(self, key: bytes, nonce: bytes | None = None) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"run key: {len(key)} bytes, need at least {MIN_KEY_BYTES}")
        if nonce is not None and len(nonce) != NONCE_BYTES:
            raise ConfigError(f"run nonce: {len(nonce)} bytes, need {NONCE_BYTES}")
        self._key = key
        self._nonce = nonce

    @classmethod
    def generate(cls) -> RunKey:
        return cls(secrets.token_hex(32).encode())

    @property
    def secret(self) -> bytes:
        """The key itself, to hand to the run's remote workers (a file of mode 0600)."""
        return self._key

    @property
    def nonce(self) -> bytes | None:
        """The run instance this key seals for; None: any (a worker's key)."""
        return self._nonce

    def for_run(self, nonce: bytes) -> RunKey:
        """The same secret, sealing for (and opening only) the run instance `nonce`."""
        return RunKey(self._key, nonce)

    def _mac(self, nonce: bytes, topic: str, body: bytes) -> bytes:
        return hmac.new(self._key, _MAGIC + nonce + topic.encode() + b"\0" + body, hashlib.sha256).digest()

    def sign(self, topic: str, body: bytes) -> bytes:
        """Seal `body` for `topic`, with this key's nonce (`UNBOUND` when it has none)."""
        nonce = UNBOUND if self._nonce is None else self._nonce
        return _MAGIC + nonce + self._mac(nonce, topic, body) + body

    def open_any(self, topic: str, payload: bytes) -> tuple[bytes, bytes] | None:
        """(nonce, body) of a payload correctly signed for `topic` with this secret, whatever its nonce."""
        if len(payload) < _HEADER or not payload.startswith(_MAGIC):
            return None
        nonce = payload[len(_MAGIC) : len(_MAGIC) + NONCE_BYTES]
        mac, body = payload[len(_MAGIC) + NONCE_BYTES : _HEADER], payload[_HEADER:]
        return (nonce, body) if hmac.compare_digest(mac, self._mac(nonce, topic, body)) else None

    def open(self, topic: str, payload: bytes) -> bytes | None:
        """The body of a message correctly signed for `topic` and for this key's run (any, without a nonce)."""
        opened = self.open_any(topic, payload)
        if opened is None:
            return None
        nonce, body = opened
        return body if self._nonce is None or hmac.compare_digest(nonce, self._nonce) else None

    def open_unbound(self, topic: str, payload: bytes) -> bytes | None:
        """For a bound key: the body of a message correctly sealed with `UNBOUND` (a Hello), else None.

        An unbound key opens such a message with `open` like any other.
        """
        if self._nonce is None or sealed_nonce(payload) != UNBOUND:
            return None
        opened = self.open_any(topic, payload)
        return None if opened is None else opened[1]

    def __repr__(self) -> str:
        return "RunKey(***)"


def load_run_key(path: str) -> RunKey:
    """Read `--run-key-file`: its bytes, surrounding whitespace removed; errors name the option."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--run-key-file {path!r}: {exc.strerror or exc}") from None
    return run_key_of(data, f"--run-key-file {path!r}")


def run_key_of(data: bytes, where: str) -> RunKey:
    """The key in a key file's bytes (surrounding whitespace removed); `where` names the file in the error."""
    key = data.strip()
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"{where}: {len(key)} bytes, need at least {MIN_KEY_BYTES}")
    return RunKey(key)


def seal(key: RunKey | None, topic: str, body: bytes) -> bytes:
    """The payload to publish on `topic`: the body, signed when the run has a key."""
    return body if key is None else key.sign(topic, body)


def unseal(key: RunKey | None, topic: str, payload: bytes) -> bytes | None:
    """The body of a payload received on `topic`; None when the run has a key and the seal fails."""
    return payload if key is None else key.open(topic, payload)


def refusal(key: RunKey, topic: str, payload: bytes) -> str:
    """Why `unseal` refused `payload`: `OTHER_RUN` for a valid seal of another run instance, else `UNSIGNED`."""
    return UNSIGNED if key.open_any(topic, payload) is None else OTHER_RUN


def sealed_nonce(payload: bytes) -> bytes | None:
    """The nonce a sealed payload claims (read, not checked: open it first)."""
    if len(payload) < _HEADER or not payload.startswith(_MAGIC):
        return None
    return payload[len(_MAGIC) : len(_MAGIC) + NONCE_BYTES]


def unchecked_body(payload: bytes) -> bytes | None:
    """The body of a sealed payload, its nonce and MAC taken off and not checked; None when unsealed.

    For tools that read a run without its key (`npcsim subscribe --all`), never for trust.
    """
    if len(payload) < _HEADER or not payload.startswith(_MAGIC):
        return None
    return payload[_HEADER:]
