"""What the router hands back for a message: one typed event, plain data (sim.protocol.router).

Location and inbox events go to the agents' mailboxes inside the router (that is routing);
everything the shard itself must act on comes back from `Router.receive` as one of these,
and the shard reads them at its phase boundaries (sim.shard):

- `BatchArrived`: a batch came in on a routed topic (the barrier counts it, even when it
  was dropped as a re-send of a tick already perceived);
- `BarrierReceived`: another shard's TickDone or Join;
- `PlayerInputReceived`: an outside player's input, within its bounds;
- `WorldStateReceived`: the game system's world state, within its bounds (and whether it
  was retained).
"""

from __future__ import annotations

import msgspec

from sim.wire.barrier import BarrierMessage
from sim.wire.events import PlayerInputMessage, WorldStateMessage

__all__ = ["BarrierReceived", "BatchArrived", "PlayerInputReceived", "Received", "WorldStateReceived"]


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


Received = BatchArrived | BarrierReceived | PlayerInputReceived | WorldStateReceived
