"""What the router hands back for a message: one typed event, plain data (sim.protocol.router),
and `refused`, how a refusal is made.

Location and inbox events go to the agents' mailboxes inside the router (that is routing);
everything the shard itself must act on comes back from `Router.receive` as one of these,
and the shard reads them at its phase boundaries (sim.shard):

- `BatchArrived`: a batch came in on a routed topic (the barrier counts it, even when it
  was dropped as a re-send of a tick already perceived);
- `BarrierReceived`: another shard's TickDone or Join;
- `PlayerInputReceived`: an outside player's input, within its bounds;
- `WorldStateReceived`: the game system's world state, within its bounds (and whether it
  was retained);
- `PresenceReceived`, `GameEventReceived`, `GameFactReceived`: the game system's other
  topics, within their bounds;
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
    Name,
    PlayerInputMessage,
    PresenceMessage,
    WorldStateMessage,
)

__all__ = [
    "BarrierReceived", "BatchArrived", "GameEventReceived", "GameFactReceived", "InputRefused", "Outside",
    "PlayerInputReceived", "PresenceReceived", "Received", "WorldStateReceived", "error_code", "id_in", "refused",
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


class PlayerInputReceived(msgspec.Struct, frozen=True):
    """Player `player` (the name in the topic) sent `message`."""

    player: str
    message: PlayerInputMessage


class WorldStateReceived(msgspec.Struct, frozen=True):
    """The game system set the world state; `retained`: the broker kept it from before the
    subscription (an earlier run's, or a `mosquitto_pub -r`), so the shard does not apply it."""

    message: WorldStateMessage
    retained: bool = False


class PresenceReceived(msgspec.Struct, frozen=True):
    """The game system says where player `player` (the name in the topic) stands."""

    player: str
    message: PresenceMessage


class GameEventReceived(msgspec.Struct, frozen=True):
    message: GameEventMessage


class GameFactReceived(msgspec.Struct, frozen=True):
    message: GameFactMessage


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


Outside = PlayerInputReceived | WorldStateReceived | PresenceReceived | GameEventReceived | GameFactReceived
"""Outside input within its bounds: what a shard journals as it arrives (sim.protocol.outside)."""

Received = BatchArrived | BarrierReceived | Outside | InputRefused
