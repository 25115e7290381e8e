"""What the bus hands the shard, acted on at the phase boundaries and while the barrier holds.

The bus queues what the shard must act on as events (sim.protocol.received); `Intake.take`
hands each to the part that owns it: batches, TickDones and Starts to the barrier, peers' Joins
and Hellos to `Peers` (sim.protocol.admission: each served once, re-sends rate-limited,
shard 0's Welcomes), and a reconnection makes the shard re-send what it keeps (`rejoin`).
Outside input went to the tick's input source as the bus received it (`Bus.keep_outside`);
here what names an NPC or place the run does not have is refused. A refused outside
message is answered on its client's error topic by one shard of the run: the one that owns
the NPC it names, shard 0 for what no shard owns (an unknown NPC or place, a payload that
could not be read).
A retained world state is never applied: a fresh run is not changed by what an earlier one
left on the broker, and a resumed one holds what it applied; it is counted when it
differs from the world of this shard's NPCs.
"""

from __future__ import annotations

from sim.bus import Bus, Connected
from sim.protocol.admission import Peers, Refused
from sim.protocol.barrier import Barrier
from sim.protocol.received import BarrierReceived, BatchArrived, InputRefused, OutsideReceived, refused
from sim.protocol.router import retained_why
from sim.shard._clock import Clock
from sim.shard._plan import ShardPlan
from sim.store import Store
from sim.wire import topics
from sim.wire.barrier import Hello, Join, Start, TickDone, Welcome
from sim.wire.events import (
    GameEventMessage,
    GameFactMessage,
    GoalMessage,
    MoveMessage,
    PlayerInputMessage,
    PresenceMessage,
    WorldStateMessage,
)

__all__ = ["Intake"]


class Intake:
    """Takes what the bus queued and hands it on; `rejoin` after (re)connecting."""

    def __init__(self, plan: ShardPlan, bus: Bus, store: Store, clock: Clock, barrier: Barrier, peers: Peers) -> None:
        self._plan, self._bus, self._store, self._clock = plan, bus, store, clock
        self.barrier, self.peers = barrier, peers

    async def take(self) -> None:
        """Act on everything the bus queued until now (taken at once, before any await)."""
        barrier, bus = self.barrier, self._bus
        rejoin = False
        for event in bus.take_events():
            match event:  # a live world state is the input source's already (Bus.keep_outside)
                case BatchArrived(shard=shard, tick=tick, topic=topic, events=events):
                    barrier.batch_received(shard, tick, topic, events)
                case BarrierReceived(message=TickDone() as done):
                    barrier.done_received(done)
                case BarrierReceived(message=Start() as start):
                    barrier.start_received(start)
                case BarrierReceived(message=Join() | Hello() | Welcome() as request):
                    self._refuse(self.peers.receive(request, self._clock.now()))
                case OutsideReceived(message=WorldStateMessage() as message, retained=True):
                    self._retained_world_state(message)
                case OutsideReceived():
                    unknown = self._unknown(event)
                    if unknown is not None and self._answers(None):
                        kind, refusal = unknown
                        bus.count_malformed(kind, refusal.error.topic, ValueError(refusal.error.message))
                        await self._answer(refusal)
                case InputRefused(npc=npc):
                    if self._answers(npc):
                        await self._answer(event)
                case Connected(again=again):
                    rejoin = rejoin or again
        if rejoin:
            await self.rejoin()
        key = bus.config.run_key
        for welcome in self.peers.welcomes(None if key is None else key.nonce):
            await bus.publish_barrier(welcome)

    async def rejoin(self) -> None:
        """After (re)connecting: re-send everything kept, then ask the others for theirs."""
        bus = self._bus
        for topic, payload in self.barrier.kept(0):
            await bus.publish(topic, payload)
        await bus.publish_barrier(self.barrier.join())

    def _answers(self, npc: str | None) -> bool:
        """Whether this shard answers a refused message naming `npc`: the shard that owns the
        NPC, shard 0 for what no shard owns (no NPC, an unknown one)."""
        layout = self._plan.layout
        if npc is not None and npc in layout.npc_location:
            return npc in layout.local
        return layout.index == 0

    def _unknown(self, event: OutsideReceived) -> tuple[str, InputRefused] | None:
        """The kind counted and the refusal of an input naming an NPC or place the run does
        not have, or None."""
        plan, run, npcs, player = self._plan, self._plan.run_id, self._plan.layout.npc_location, event.name
        match event.message:
            case PlayerInputMessage() as message if message.to not in npcs:
                return "player input to an unknown NPC", refused(
                    "unknown_npc", topics.player_input(run, player), f"no NPC {message.to!r} in this run",
                    player=player, input_id=message.id)
            case GameFactMessage() as message if message.npc is not None and message.npc not in npcs:
                return "game fact for an unknown NPC", refused(
                    "unknown_npc", topics.game_fact(run), f"no NPC {message.npc!r} in this run", input_id=message.id)
            case MoveMessage() as message if message.npc not in npcs:
                return "game move of an unknown NPC", refused(
                    "unknown_npc", topics.game_move(run), f"no NPC {message.npc!r} in this run")
            case MoveMessage() as message if message.location not in plan.locations:
                return "game move to an unknown place", refused(
                    "unknown_location", topics.game_move(run), f"no place {message.location!r} in this run")
            case GoalMessage() as message if message.npc not in npcs:
                return "game goal for an unknown NPC", refused(
                    "unknown_npc", topics.game_goal(run), f"no NPC {message.npc!r} in this run")
            case GameEventMessage() as message if message.location not in plan.locations:
                return "game event at an unknown place", refused(
                    "unknown_location", topics.game_event(run), f"no place {message.location!r} in this run")
            case PresenceMessage() as message if (
                message.location is not None and message.location not in plan.locations
            ):
                return "presence at an unknown place", refused(
                    "unknown_location", topics.player_presence(run, player),
                    f"no place {message.location!r} in this run")
        return None

    async def _answer(self, refusal: InputRefused) -> None:
        await self._bus.publish_error(refusal.player, refusal.error, self._clock.now())

    def _refuse(self, refused: Refused | None) -> None:
        if refused is not None:
            self._bus.refuse(refused.kind, topics.barrier(self._plan.run_id, refused.peer), refused.why)

    def _retained_world_state(self, message: WorldStateMessage) -> None:
        """Counted, and said once, when it differs from the world of this shard's NPCs."""
        unheld = dict(message.state)
        world_value = self._store.world_value  # no state built for each of a shard's NPCs
        for agent in self._plan.layout.local:
            for key in [key for key, value in unheld.items() if world_value(agent, key) == value]:
                del unheld[key]
            if not unheld:
                return
        topic = topics.world_state(self._plan.run_id)
        self._bus.refuse("retained world state", topic, retained_why(topic))
