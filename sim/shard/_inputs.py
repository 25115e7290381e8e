"""The tick's first phase: what comes from outside the NPCs, as events.

A tick takes, in this order: the world-state changes due at its start (announced by shard
0's TickDone of the tick before, so every shard sets them at the same tick), its scripted
and bot players' inputs (functions of seed and tick) and the outside clients' input that
arrived before this point, each stored with the tick that takes it.

Where outside input and world changes come from is an `InputSource`: `LiveInputs` takes
what arrives on the bus (journaled as it arrives, held to its per-tick bound, a resume's
journal first); a re-execution takes what the recorded run took (`RecordedInputs`: the
store keeps each outside input and world-state change with the tick it took effect at, and
a shard given these takes them at those ticks, with the numbers the run gave them, and
nothing that arrives on its bus, so the run is executed again exactly).
The tick calls either the same way. `WorldState` holds the world-state changes in one
place: what arrived, what a resume's journal held, what is due next tick.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container, Iterable
from typing import Protocol

import msgspec

from sim.bus import Bus
from sim.memory import WorldFact
from sim.protocol.bounds import limit_player_inputs
from sim.protocol.outside import OutsideInput, OutsideJournal, PlayerArrival, WorldArrival
from sim.protocol.received import PlayerInputReceived, WorldStateReceived
from sim.shard._clock import checkpoint
from sim.shard._context import ShardContext
from sim.shard._registry import Player
from sim.store import Store, Writer
from sim.wire import topics
from sim.wire.events import PlayerInputMessage, Speech, event_id

__all__ = ["InputSource", "LiveInputs", "RecordedInputs", "TickInputs", "WorldState"]

_WORLD_SLICE = 20_000  # NPCs whose world state is set between two yields


class WorldState:
    """The run's world-state changes as one shard holds them: what arrived (shard 0 announces
    it in its next TickDone), what a resume's journal held for a tick, and what is due at
    the start of the next tick (the barrier's, or what the last commit left)."""

    def __init__(self) -> None:
        self._arrived: list[dict[str, str]] = []
        self._held: dict[int, list[dict[str, str]]] = {}
        self.due: dict[str, str] | None = None

    def arrive(self, state: dict[str, str]) -> None:
        self._arrived.append(state)

    def hold(self, tick: int, state: dict[str, str]) -> None:
        """A change that arrived for `tick` before a resume (the arrivals journal)."""
        self._held.setdefault(tick, []).append(state)

    def announce(self, tick: int) -> dict[str, str] | None:
        """What the TickDone of `tick` announces: what was held for it, then what arrived, in
        the order they came, the later key winning; None when nothing changed."""
        world: dict[str, str] = {}
        for state in self._held.pop(tick, []) + self._arrived:
            world.update(state)
        self._arrived.clear()
        return world or None

    def take_due(self) -> dict[str, str] | None:
        due, self.due = self.due, None
        return due


class InputSource(Protocol):
    """Where a tick's outside input and world-state changes come from."""

    def journal(self, event: PlayerInputReceived | WorldStateReceived) -> None:
        """An outside input, as the bus receives it (before the tick that takes it)."""

    def receive(self, event: PlayerInputReceived | WorldStateReceived) -> None:
        """An outside input for this shard, as the tick takes what the bus queued."""

    def close_inputs(self, tick: int) -> None:
        """Tick `tick` takes the input that arrived until now; what arrives later is the next one's."""

    def close_world(self, tick: int) -> None:
        """The TickDone of `tick` takes the world state that arrived until now."""

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        """The world-state changes set at the start of `tick` (`announced`: by the barrier)."""

    def inputs_at(self, tick: int) -> list[OutsideInput]:
        """The outside inputs `tick` takes, numbered."""


class LiveInputs:
    """Outside input from the bus: journaled with the tick that takes it (sim.store's arrivals),
    held to its per-tick bound, numbered in the order taken; what a resume's journal held
    for a tick comes first. `takes_world`: shard 0, which announces world-state changes."""

    def __init__(self, store: Store, bus: Bus, world: WorldState, *, local: Container[str],
                 takes_world: bool, tick: int, per_tick: int) -> None:
        self._store, self._bus, self._world = store, bus, world
        self._stamps = OutsideJournal(local, takes_world=takes_world, tick=tick)
        self._per_tick = per_tick
        self._arrived: list[tuple[str, PlayerInputMessage]] = []
        self._held: dict[int, list[tuple[str, PlayerInputMessage]]] = {}
        for arrival in store.arrivals.pending:  # a tick cut short (kill -9) takes them again
            match arrival:
                case PlayerArrival(tick=at, player=player, to=to, text=text):
                    self._held.setdefault(at, []).append((player, PlayerInputMessage(to=to, text=text)))
                case WorldArrival(tick=at, state=state):
                    world.hold(at, state)

    def journal(self, event: PlayerInputReceived | WorldStateReceived) -> None:
        arrival = self._stamps.stamp(event)
        if arrival is not None:
            self._store.arrivals.add(arrival)

    def receive(self, event: PlayerInputReceived | WorldStateReceived) -> None:
        match event:
            case PlayerInputReceived(player=player, message=message):
                self._arrived.append((player, message))
            case WorldStateReceived(message=message, retained=False):
                self._world.arrive(dict(message.state))
            case WorldStateReceived():
                pass  # never applied (sim.shard._intake counts it)

    def close_inputs(self, tick: int) -> None:
        self._stamps.inputs_taken(tick)

    def close_world(self, tick: int) -> None:
        self._stamps.world_taken(tick)

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        return announced

    def inputs_at(self, tick: int) -> list[OutsideInput]:
        arrived = self._held.pop(tick, []) + self._arrived
        self._arrived.clear()
        taken = limit_player_inputs(arrived, self._per_tick, self._bus)
        return [OutsideInput(seq=seq, player=player, to=message.to, text=message.text)
                for seq, (player, message) in enumerate(taken)]


class RecordedInputs(msgspec.Struct, frozen=True, kw_only=True):
    """The input source of a re-execution: `inputs[tick]`, the outside inputs the run took
    at that tick, in seq order (every shard's: each shard takes its own NPCs'); `world[tick]`,
    the keys and values set at the start of that tick."""

    inputs: dict[int, list[OutsideInput]] = {}
    world: dict[int, dict[str, str]] = {}

    def journal(self, event: PlayerInputReceived | WorldStateReceived) -> None:
        pass  # nothing live is taken, so nothing is journaled

    def receive(self, event: PlayerInputReceived | WorldStateReceived) -> None:
        pass

    def close_inputs(self, tick: int) -> None:
        pass

    def close_world(self, tick: int) -> None:
        pass

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        return self.world.get(tick)

    def inputs_at(self, tick: int) -> list[OutsideInput]:
        return self.inputs.get(tick, [])


class TickInputs:
    """Phase 1: the world-state changes due, the players' inputs and the outside inputs of a
    tick, as events in its outbox (and in the store, with the tick that takes them)."""

    def __init__(self, ctx: ShardContext, source: InputSource, world: WorldState,
                 take_events: Callable[[], Awaitable[None]]) -> None:
        """`take_events`: what the bus queued, acted on (sim.shard._intake)."""
        self._ctx, self._source, self._world, self._take_events = ctx, source, world, take_events
        self.players: list[Player] = []  # shard 0's scripted and bot players (set at start)

    async def take(self, tick: int) -> None:
        ctx, stats, store = self._ctx, self._ctx.stats, self._ctx.store
        world = self._source.world_at(tick, self._world.take_due())
        if world:
            stats.world_changes += await _apply_world_state(store, (s.id for s in ctx.specs), world)
            await store.resume.record_world(tick, world)
        for player in self.players:
            for event in player.inputs(tick):
                self._emit_player(player.location, event)
                stats.player_inputs += 1
        self._source.close_inputs(tick)  # what arrived until now is this tick's input
        await self._take_events()
        local = ctx.layout.local
        for taken in self._source.inputs_at(tick):
            if taken.to not in local:
                continue  # a recorded run's input to another shard's NPC
            await store.resume.record_input(tick, taken)
            event = Speech(id=event_id(ctx.run_id, taken.player, tick, 1_000_000 + taken.seq), tick=tick,
                           speaker=taken.player, to=taken.to, text=taken.text, from_player=True)
            ctx.outbox.emit(topics.agent_inbox(ctx.run_id, taken.to), event)
            stats.player_inputs += 1

    def _emit_player(self, location: str | None, event: Speech) -> None:
        """A player standing at the NPC's place is overheard there; otherwise it is a direct message."""
        ctx = self._ctx
        if event.to is None:
            raise ValueError(f"player event {event.id!r} has no addressee")
        if location is not None and location == ctx.npc_location.get(event.to):
            ctx.outbox.emit(ctx.location_topic(location), event)
        else:
            ctx.outbox.emit(topics.agent_inbox(ctx.run_id, event.to), msgspec.structs.replace(event, location=None))


async def _apply_world_state(store: Store, agents: Iterable[str], state: dict[str, str]) -> int:
    """Set what the game system changed, with its authority; returns how many of its keys
    changed something (a key set anew counts once, however many NPCs hold it).

    Every NPC is looked at (each holds its own world state), in slices between yields."""
    changed: set[str] = set()
    entries = sorted(state.items())
    for n, agent in enumerate(agents, start=1):
        for key, value in entries:
            if store.world_value(agent, key) != value:
                await store.set_world(agent, WorldFact(key=key, value=value), writer=Writer.GAME)
                changed.add(key)
        if n % _WORLD_SLICE == 0:
            await checkpoint()
    return len(changed)
