"""What the router hands back for a message: one typed event, plain data (sim.protocol.router),
and `refused`, how a refusal is made.

Location and inbox events go to the agents' mailboxes inside the router (that is routing);
everything the shard itself must act on comes back from `Router.receive` as one of these,
and the shard reads them at its phase boundaries (sim.shard):

- `BatchArrived`: a batch came in on a routed topic (the barrier counts it, even when it
  was dropped as a re-send of a tick already perceived);
- `BarrierReceived`: another shard's TickDone or Join;
- `OutsideReceived`: outside input on a public channel the shard takes (a player's input,
  the game system's world state, events, facts and players' presence), within its bounds;
- `InputRefused`: a message on a public topic refused, with the error its client is to get.
"""

from __future__ import annotations

import msgspec

from sim.wire.barrier import BarrierMessage
from sim.wire.decoding import json_reader
from sim.wire.events import (
    ErrorCode,
    ErrorMessage,
    GameEventMessage,
    GameFactMessage,
    GoalMessage,
    MoveMessage,
    Name,
    PlayerInputMessage,
    PresenceMessage,
    WorldStateMessage,
)

__all__ = [
    "BarrierReceived", "BatchArrived", "InputRefused", "OutsideMessage", "OutsideReceived", "Received", "error_code",
    "id_in", "refused",
]


class BatchArrived(msgspec.Struct, frozen=True):
    """Shard `shard`'s batch of `events` events for `tick` arrived on `topic`."""

    shard: str
    tick: int
    topic: str
    events: int


class BarrierReceived(msgspec.Struct, frozen=True):
    """A shard's barrier message, on its own barrier topic (and signed, with a run key)."""

    message: BarrierMessage


OutsideMessage = (PlayerInputMessage | PresenceMessage | GameEventMessage | GameFactMessage | WorldStateMessage
                  | MoveMessage | GoalMessage)
"""The payloads of the public channels the shard takes (sim.wire.contract.CHANNELS)."""


class OutsideReceived(msgspec.Struct, frozen=True):
    """Outside input within its bounds: `message` on the public channel called `channel`;
    `name` is the name its topic holds (the player of `player/{player}/input` and of its
    presence; "" when the topic holds none, as `topics.parse` says). `retained`: the broker kept it from before the
    subscription (a world state of an earlier run's, or a `mosquitto_pub -r`), so the shard
    does not apply it. What a shard journals as it arrives (sim.protocol.outside)."""

    channel: str
    name: str
    message: OutsideMessage
    retained: bool = False


class InputRefused(msgspec.Struct, frozen=True):
    """A message on a public topic was refused (and counted): `error` is the reply for
    `player` (None: the game system). `npc` is the NPC it named, when one could be read:
    the shard that owns it answers (shard 0 what no shard owns)."""

    error: ErrorMessage
    player: str | None = None
    npc: str | None = None


class _WithId(msgspec.Struct):
    """Only the `id` of a refused message, read leniently to echo it in the error."""

    id: Name | None = None


_with_id = json_reader(_WithId)


def id_in(payload: bytes) -> str | None:
    """The `id` of a malformed JSON object, when it has a valid one."""
    try:
        return _with_id.decode(payload).id
    except msgspec.DecodeError:
        return None


def error_code(exc: msgspec.DecodeError) -> ErrorCode:
    """`schema` when the payload is JSON but not the topic's message, `not_json` otherwise."""
    return "schema" if isinstance(exc, msgspec.ValidationError) else "not_json"


def refused(code: ErrorCode, topic: str, why: str, *, player: str | None = None, npc: str | None = None,
             input_id: str | None = None) -> InputRefused:
    """The refusal of a message on `topic`, with the error for `player` (None: the game system)."""
    error = ErrorMessage(code=code, message=why[:300], topic=topic[:1000], id=input_id)
    return InputRefused(error, player=player, npc=npc)


Received = BatchArrived | BarrierReceived | OutsideReceived | InputRefused
