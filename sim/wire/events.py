"""Wire types of the simulation bus and their module-level codecs.

Internal topics (location events, inboxes) carry msgpack; public topics (say, player
input, presence, errors, the game system's topics, status) carry JSON so that
`mosquitto_sub` can read them. Every event has an `id`
that is unique in its run, so a QoS 1 redelivery is applied once.

Event ids are built from (agent, tick, seq), not from a random source: the same run
gives the same ids, which keeps episodic memory ids (and so prompts) deterministic.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

import msgspec

from sim.wire.decoding import json_reader, msgpack_reader

__all__ = [
    "ERROR_CODES",
    "MAX_NAME_CHARS",
    "MAX_TEXT_CHARS",
    "AnyEvent",
    "ErrorCode",
    "FactAction",
    "ErrorMessage",
    "EventBatch",
    "GameEventMessage",
    "GameFactMessage",
    "GoalMessage",
    "IntentMessage",
    "LocationMessage",
    "MoveMessage",
    "NAME_RULE",
    "Name",
    "Notice",
    "PlayerInputMessage",
    "PresenceMessage",
    "SayMessage",
    "Speech",
    "StatusMessage",
    "WorldStateMessage",
    "decode_batch",
    "decode_error",
    "decode_intent",
    "decode_location",
    "decode_player_input",
    "decode_world_state",
    "decode_say",
    "decode_status",
    "encode_batch",
    "encode_json",
    "event_id",
    "is_name",
]

Tick = Annotated[int, msgspec.Meta(ge=0)]
MAX_TEXT_CHARS = 4000
"""An event's text at most (a line, a player's input, the game system's narration or fact): so
also the most a run's bound on outside text may be (sim.wire.channel's `MessageBounds`)."""
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT_CHARS)]
OutsideText = Annotated[str, msgspec.Meta(min_length=1)]
"""Text on a public topic a client writes: its length is held to the run's bound (the channel's
`Bound`, which the contract's schema states), never by the decoder, so over it is `too_long`."""
MAX_NAME_CHARS = 128
_NAME_PATTERN = rf"^[A-Za-z0-9_.-]{{1,{MAX_NAME_CHARS}}}\Z"
"""An id (an NPC, a player, a place, a world-state key): `NAME_RULE`. One rule for the wire
(`Name`), the scenario, the topics (`topics.check_player`), the router (a player id read
from its topic) and the output gates (a belief's subject). `\\Z`, not `$`: `$` lets a
trailing newline through."""
NAME_RULE = f"1-{MAX_NAME_CHARS} characters of A-Z a-z 0-9 _ . -"
"""`Name`'s rule in words, for errors and the contract's documents."""
Name = Annotated[str, msgspec.Meta(pattern=_NAME_PATTERN)]
_NAME = re.compile(_NAME_PATTERN)


def is_name(text: str) -> bool:
    """Whether `text` is a `Name`."""
    return _NAME.match(text) is not None


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True):
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=300)]
    tick: Tick
    location: str | None = None


class Speech(_Event, tag="speech", frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Someone said something: an NPC's line, or a player's input.

    `to` is who was addressed (None: said to the room). `turn` counts the replies in an
    NPC-to-NPC exchange, so that two NPCs do not talk to each other forever.
    `from_player` marks a player's input: the addressee always answers it; `input_id` is
    the id its client gave it (`PlayerInputMessage.id`), which the answer's `say` carries.
    """

    speaker: Name
    text: Text
    to: Name | None = None
    turn: Annotated[int, msgspec.Meta(ge=0)] = 0
    from_player: bool = False
    input_id: Name | None = None


class Notice(_Event, tag="notice", frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Something happened at a place that nobody said: the game system's narration."""

    text: Text
    significance: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.5


AnyEvent = Speech | Notice


class EventBatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One message: every event a shard produced for one topic in one tick."""

    shard: str
    tick: Tick
    events: tuple[AnyEvent, ...]


class SayMessage(msgspec.Struct, frozen=True, kw_only=True):
    """What an NPC said, on its public `say` topic.

    An answer to a player carries the player's id in `in_reply_to`, and the `id` its client
    gave the input in `reply_to` (null when the input had none, or the line answers no player).
    """

    run: str
    agent: str
    tick: int
    to: str | None
    text: str
    inference_id: str
    reply_to: str | None = None
    in_reply_to: str | None = None


class IntentMessage(msgspec.Struct, frozen=True, kw_only=True):
    """What an NPC proposes the game do, on its public `intent` topic: an intent on its
    allow-list, each argument of the type or one of the values the allow-list gives it, that
    passed every gate (docs/npc-output.md). `inference_id` names the inference (and its
    `say`); `reply_to` is the `id` of the player input it answered (null when none)."""

    run: str
    agent: str
    tick: int
    name: str
    args: dict[str, str | int | float | bool]
    inference_id: str
    reply_to: str | None = None


class LocationMessage(msgspec.Struct, frozen=True, kw_only=True):
    """Where an NPC stands from tick `tick` on, and what it does there (retained: a new subscriber
    sees where everyone is)."""

    run: str
    agent: str
    tick: int
    location: str
    activity: str = ""


class PlayerInputMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A player's input from an outside client: `{"to": "<npc id>", "text": "...", "id": "q1"}`.

    `id` (optional, a name the client chooses) comes back in the answer's `say` as
    `reply_to`, and in an error reply to this input.
    """

    to: Name
    text: OutsideText
    id: Name | None = None


class PresenceMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where a live player stands, as the game system says (`player/{player}/presence`):
    `{"location": "inn"}`; null: nowhere. The NPCs at that place overhear what the player
    says to one of them there."""

    location: Name | None


class GameEventMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Something happened at a place (`game/event`): everyone there perceives it next tick,
    as a memory of the given significance (0 to 1)."""

    location: Name
    text: OutsideText
    significance: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.5


class MoveMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The game moves NPC `npc` to place `location` (`game/move`), from the next tick on."""

    npc: Name
    location: Name


class GoalMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """NPC `npc`'s current goal, as the game sets it (`game/goal`); null clears it."""

    npc: Name
    goal: OutsideText | None


FactAction = Literal["add", "replace", "withdraw"]


class GameFactMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A canonical fact the game system adds, replaces or withdraws (`game/fact`), by id: for
    NPC `npc`, or for every NPC when `npc` is null. `add` (the default) refuses an id the NPC
    holds already (`exists`); `replace` gives a held fact a new text and `withdraw` removes
    it (no `text`), each refused `no_fact` when no NPC it is for holds the id."""

    id: Name
    text: OutsideText | None = None
    npc: Name | None = None
    action: FactAction = "add"

    def __post_init__(self) -> None:
        if (self.text is None) != (self.action == "withdraw"):
            raise ValueError(f"a fact to {self.action} {'needs its' if self.text is None else 'takes no'} `text`")


ErrorCode = Literal[
    "not_json", "schema", "not_allowed", "unknown_npc", "unknown_location", "too_long", "rate_limited", "retained",
    "exists", "busy", "over_budget", "no_fact",
]
"""Why a message on a public topic was refused (docs/topics.md, "Errors"):
`not_json` (the payload is not JSON), `schema` (not the topic's fields and types, or a
player id that is not a name), `not_allowed` (a player id that is an internal role's
login), `unknown_npc`, `unknown_location`, `too_long` (over a
bound of the run), `rate_limited` (over a rate; also the one reply when a client's errors
are held back), `retained` (a retained message: only live ones are taken), `exists` (a
fact id the NPC holds already), `busy` (the NPC or the shard took all the inputs a tick
takes; try again), `over_budget` (a fact the NPC cannot hold: past its count, or its prompt's
mandatory part would not fit the budget), `no_fact` (a fact to replace or withdraw that no NPC
it is for holds)."""
ERROR_CODES: tuple[ErrorCode, ...] = get_args(ErrorCode)


class ErrorMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Why a message was refused: on `player/{player}/error` for a player's input, on
    `game/error` for the game system's topics (players' presence included). `topic` is where the refused
    message was published, `id` the input's id when it had one that could be read."""

    code: ErrorCode
    message: Annotated[str, msgspec.Meta(max_length=300)]
    topic: Annotated[str, msgspec.Meta(max_length=1000)]
    id: Name | None = None


class WorldStateMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The world state as the game system sets it (retained): `{"state": {"king": "dead"}}`.

    Only this topic changes NPCs' world state; the store writes it with the game system's
    authority, so model output can never change it.
    """

    state: dict[Name, str]
    tick: int | None = None


class StatusMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A shard's liveness (retained, and the last will with state "offline").

    While the tick barrier holds the shard, `awaiting` says for what (for example
    "shard 1") and `since` since when (Unix time, seconds).
    """

    run: str
    shard: str
    state: str
    tick: int | None = None
    awaiting: str | None = None
    since: float | None = None


def event_id(run: str, agent: str, tick: int, seq: int) -> str:
    """The id of the `seq`-th event `agent` caused in `tick`: unique in the run, reproducible."""
    return f"{run}:{agent}:{tick}:{seq}"


_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()
_batch = msgpack_reader(EventBatch)
_player_input = json_reader(PlayerInputMessage)
_say = json_reader(SayMessage)
_intent = json_reader(IntentMessage)
_location = json_reader(LocationMessage)
_status = json_reader(StatusMessage)
_world = json_reader(WorldStateMessage)
_error = json_reader(ErrorMessage)


def encode_batch(batch: EventBatch) -> bytes:
    return _msgpack.encode(batch)


JsonMessage = (
    SayMessage | IntentMessage | LocationMessage | StatusMessage | PlayerInputMessage | WorldStateMessage
    | PresenceMessage | GameEventMessage | GameFactMessage | MoveMessage | GoalMessage | ErrorMessage
)


def encode_json(message: JsonMessage) -> bytes:
    return _json.encode(message)


def decode_batch(data: bytes) -> EventBatch:
    """Raises msgspec.DecodeError (or ValidationError) on a malformed payload."""
    return _batch.decode(data)


def decode_player_input(data: bytes) -> PlayerInputMessage:
    return _player_input.decode(data)


def decode_say(data: bytes) -> SayMessage:
    return _say.decode(data)


def decode_intent(data: bytes) -> IntentMessage:
    return _intent.decode(data)


def decode_location(data: bytes) -> LocationMessage:
    return _location.decode(data)


def decode_status(data: bytes) -> StatusMessage:
    return _status.decode(data)


def decode_world_state(data: bytes) -> WorldStateMessage:
    return _world.decode(data)


def decode_error(data: bytes) -> ErrorMessage:
    return _error.decode(data)
