"""What a public channel is: its route, payload type, bound and roles (sim.wire.contract's
`CHANNELS` holds one `Channel` per channel). Pure, and a leaf of sim.wire: the protocol reads
a channel's bound and decoder here without the documents' types."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Literal

from sim.wire import topics
from sim.wire.decoding import Reader, json_reader

__all__ = ["Bound", "Channel", "EntriesBound", "Role", "TextBound"]


@dataclass(frozen=True)
class Role:
    """Who publishes on a channel, and so what the server does there (AsyncAPI's operation)."""

    name: str
    action: Literal["send", "receive"]
    description: str
    acl: Literal["shard", "player", "game"]
    """Its role in broker-config/acl (a player's login is its id)."""


@dataclass(frozen=True)
class TextBound:
    """The payload's `text` has at most `InputBounds.<chars>` characters (sim.protocol.bounds)."""

    chars: str
    over: ClassVar[str] = "too long"
    """What a message over it is, in the refusal counts."""


@dataclass(frozen=True)
class EntriesBound:
    """The payload's `state` has at most `InputBounds.<keys>` entries, each key at most
    `<key_chars>` characters and each value at most `<value_chars>` (sim.protocol.bounds)."""

    keys: str
    key_chars: str
    value_chars: str
    over: ClassVar[str] = "over its bounds"


Bound = TextBound | EntriesBound
"""What the run holds a channel's payload to, named by `InputBounds`' fields."""


@dataclass(frozen=True)
class Channel:
    """One public channel: its route (a topic function of `sim.wire.topics`), the type of its
    JSON payload, its bound, and who publishes and reads it.

    `subscribe`: the topic filter that takes every topic of the channel (None: its topic, which
    holds the run only). `sender_named`: the name in the topic is its publisher's own login (the
    ACL's `%u`), which is never a role's login, and the one its errors go to."""

    name: str
    topic: Callable[..., str]
    payload: Any
    publishers: tuple[Role, ...]
    retained: bool
    readers: str
    summary: str
    bound: Bound | None = None
    subscribe: Callable[[str], str] | None = None
    sender_named: bool = False

    @cached_property
    def kind(self) -> topics.TopicKind:
        """What `topics.parse` says a topic of this channel is."""
        parsed = topics.parse(self.address)
        assert parsed is not None, f"{self.address}: a topic that topics.parse does not read"
        return parsed.kind

    @cached_property
    def parameters(self) -> tuple[str, ...]:
        """The names its topic function takes (`run`, then fields of the message): read once."""
        return tuple(inspect.signature(self.topic).parameters)

    @cached_property
    def what(self) -> str:
        """What its messages are called in the malformed and refusal counts: `player input`."""
        return self.kind.replace("_", " ")

    @cached_property
    def reader(self) -> Reader[Any]:
        """The decoder of its JSON payload (sim.wire.decoding: nesting past the stack is a DecodeError)."""
        return json_reader(self.payload)

    def filter(self, run: str) -> str:
        """The topic filter that takes every message of this channel in `run`."""
        return self.topic(run) if self.subscribe is None else self.subscribe(run)

    @property
    def address(self) -> str:
        """The topic with each parameter as `{name}`: `npcsim/{run}/agent/{agent}/say`."""
        return self.topic(*(f"{{{name}}}" for name in self.parameters))
