"""What a public channel is: its route, payload type, bound and roles (sim.wire.contract's
`CHANNELS` holds one `Channel` per channel). Pure, and a leaf of sim.wire: the protocol reads
a channel's bound and decoder here without the documents' types.

A bound names fields of `MessageBounds`, whose defaults are both what a run holds a message
to (sim.protocol.bounds) and what the contract's schema states (`maxLength`, ...): one number
for each, so the two cannot disagree."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from sim.wire import topics
from sim.wire.decoding import Reader, json_reader
from sim.wire.events import MAX_NAME_CHARS, MAX_TEXT_CHARS

__all__ = ["Bound", "Channel", "EntriesBound", "MessageBounds", "Role", "TextBound"]


@dataclass(frozen=True)
class Role:
    """Who publishes on a channel, and so what the server does there (AsyncAPI's operation)."""

    name: str
    action: Literal["send", "receive"]
    description: str
    acl: Literal["shard", "player", "game"]
    """Its role in broker-config/acl (a player's login is its id)."""


TextChars = Annotated[int, msgspec.Meta(ge=1, le=MAX_TEXT_CHARS)]
"""Outside text becomes an event's, which carries at most MAX_TEXT_CHARS."""


class MessageBounds(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the run holds one outside message to, named by the channels' bounds. The defaults
    are the contract's (its schemas state them); a run may set its own (`npcsim run --set
    limits.bounds.NAME=VALUE`, sim.protocol.bounds' `InputBounds`), as far as the wire carries."""

    player_text_chars: TextChars = 500
    game_text_chars: TextChars = 1000
    world_keys: Annotated[int, msgspec.Meta(ge=1)] = 64
    world_key_chars: Annotated[int, msgspec.Meta(ge=1, le=MAX_NAME_CHARS)] = 64
    world_value_chars: Annotated[int, msgspec.Meta(ge=1)] = 256


@dataclass(frozen=True)
class TextBound:
    """The payload's `field` (its `text` unless named) has at most `MessageBounds.<chars>` characters."""

    chars: str
    field: str = "text"
    over: ClassVar[str] = "too long"
    """What a message over it is, in the refusal counts."""


@dataclass(frozen=True)
class EntriesBound:
    """The payload's `state` has at most `MessageBounds.<keys>` entries, each key at most
    `<key_chars>` characters and each value at most `<value_chars>`."""

    keys: str
    key_chars: str
    value_chars: str
    over: ClassVar[str] = "over its bounds"


Bound = TextBound | EntriesBound
"""What the run holds a channel's payload to, named by `MessageBounds`' fields."""


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
