"""The tick's first phase: what comes from outside the NPCs, as events.

A tick takes, in this order: the world-state changes due at its start (announced by shard
0's TickDone of the tick before, so every shard sets them at the same tick), its scripted
and bot players' inputs (functions of seed and tick) and the outside clients' input that
arrived before this point, each stored with the tick that takes it: players' input (to an
NPC's inbox, or overheard at its place when the game system says the player stands there),
players' presence, the game system's events (a `Notice` at the place) and canonical facts
(added with the game system's authority; a fact id an NPC holds already is refused).

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

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import msgspec

from sim.bus import Bus
from sim.memory import Fact, WorldFact
from sim.protocol.bounds import limit_player_inputs
from sim.protocol.outside import (
    GameEvent,
    GameFact,
    InputArrival,
    OutsideInput,
    OutsideJournal,
    Presence,
    Taken,
    WorldArrival,
    taken_of,
)
from sim.protocol.received import InputRefused, Outside, WorldStateReceived, refused
from sim.shard._clock import checkpoint
from sim.shard._context import ShardContext
from sim.shard._registry import Player
from sim.store import Store, Writer
from sim.wire import topics
from sim.wire.events import Notice, Speech, event_id

__all__ = ["InputSource", "LiveInputs", "RecordedInputs", "TickInputs", "WorldState"]

_WORLD_SLICE = 20_000  # NPCs whose world state or facts are set between two yields
_OUTSIDE_SEQ = 1_000_000  # an outside input's event is numbered after every line its speaker says in a tick


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

    def journal(self, event: Outside) -> None:
        """An outside input, as the bus receives it (before the tick that takes it)."""

    def receive(self, event: Outside) -> None:
        """An outside input, as the tick takes what the bus queued (kept if this shard takes it)."""

    def close_inputs(self, tick: int) -> None:
        """Tick `tick` takes the input that arrived until now; what arrives later is the next one's."""

    def close_world(self, tick: int) -> None:
        """The TickDone of `tick` takes the world state that arrived until now."""

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        """The world-state changes set at the start of `tick` (`announced`: by the barrier)."""

    def inputs_at(self, tick: int) -> list[Taken]:
        """The outside inputs `tick` takes, numbered."""

    def take_refused(self) -> list[InputRefused]:
        """The inputs refused since the last call (over the per-tick bound), to be answered."""


class LiveInputs:
    """Outside input from the bus: journaled with the tick that takes it (sim.store's arrivals),
    held to its per-tick bound (the excess refused, `take_refused`), numbered in the order
    taken; what a resume's journal held for a tick comes first. `journal` stamps each
    arrival and says which this shard takes (its NPCs' and places', shard 0 the world state)."""

    def __init__(self, store: Store, bus: Bus, world: WorldState, *, journal: OutsideJournal, per_tick: int) -> None:
        self._store, self._bus, self._world = store, bus, world
        self._stamps = journal
        self._per_tick = per_tick
        self._arrived: list[Taken] = []
        self._held: dict[int, list[Taken]] = {}
        self._refused: list[InputRefused] = []
        for arrival in store.arrivals.pending:  # a tick cut short (kill -9) takes them again
            match arrival:
                case InputArrival(tick=at, input=taken):
                    self._held.setdefault(at, []).append(taken)
                case WorldArrival(tick=at, state=state):
                    world.hold(at, state)

    def journal(self, event: Outside) -> None:
        arrival = self._stamps.stamp(event)
        if arrival is not None:
            self._store.arrivals.add(arrival)

    def receive(self, event: Outside) -> None:
        if not self._stamps.takes(event):
            return  # another shard's, or a retained world state (never applied: sim.shard._intake counts it)
        if isinstance(event, WorldStateReceived):
            self._world.arrive(dict(event.message.state))
        else:
            self._arrived.append(taken_of(event))

    def close_inputs(self, tick: int) -> None:
        self._stamps.inputs_taken(tick)

    def close_world(self, tick: int) -> None:
        self._stamps.world_taken(tick)

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        return announced

    def inputs_at(self, tick: int) -> list[Taken]:
        arrived = self._held.pop(tick, []) + self._arrived
        self._arrived.clear()
        taken, over = limit_player_inputs(arrived, self._per_tick)
        for player_input in over:
            why = f"more than {self._per_tick} inputs in one tick"
            self._bus.refuse("player inputs over the per-tick bound", f"player {player_input.player!r}", why)
            topic = topics.player_input(self._bus.config.run, player_input.player)
            self._refused.append(refused("rate_limited", topic, why, player=player_input.player,
                                         npc=player_input.to, input_id=player_input.id))
        return [msgspec.structs.replace(t, seq=seq) for seq, t in enumerate(taken)]

    def take_refused(self) -> list[InputRefused]:
        refusals, self._refused = self._refused, []
        return refusals


class RecordedInputs(msgspec.Struct, frozen=True, kw_only=True):
    """The input source of a re-execution: `inputs[tick]`, the outside inputs the run took
    at that tick, in seq order (every shard's: each shard takes its own NPCs'); `world[tick]`,
    the keys and values set at the start of that tick."""

    inputs: dict[int, list[Taken]] = {}
    world: dict[int, dict[str, str]] = {}

    def journal(self, event: Outside) -> None:
        pass  # nothing live is taken, so nothing is journaled

    def receive(self, event: Outside) -> None:
        pass

    def close_inputs(self, tick: int) -> None:
        pass

    def close_world(self, tick: int) -> None:
        pass

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        return self.world.get(tick)

    def inputs_at(self, tick: int) -> list[Taken]:
        return self.inputs.get(tick, [])

    def take_refused(self) -> list[InputRefused]:
        return []


class TickInputs:
    """Phase 1: the world-state changes due, the players' inputs and the outside inputs of a
    tick, as events in its outbox (and in the store, with the tick that takes them)."""

    def __init__(self, ctx: ShardContext, source: InputSource, world: WorldState,
                 take_events: Callable[[], Awaitable[None]]) -> None:
        """`take_events`: what the bus queued, acted on (sim.shard._intake)."""
        self._ctx, self._source, self._world, self._take_events = ctx, source, world, take_events
        self.players: list[Player] = []  # shard 0's scripted and bot players (set at start)
        self.presence: dict[str, str] = {}
        """Where each outside player stands, as the game system said (kept with each tick's commit)."""

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
        for taken in self._source.inputs_at(tick):
            if await self._take(tick, taken):
                await store.resume.record_input(tick, taken)
        for refusal in self._source.take_refused():
            await self._answer(refusal)

    async def _take(self, tick: int, taken: Taken) -> bool:
        """Act on one outside input; whether this shard took it (a recorded run's input for
        another shard's NPC or place, or a fact refused, is not)."""
        ctx = self._ctx
        match taken:
            case OutsideInput(seq=seq, player=player, to=to, text=text, id=input_id):
                if to not in ctx.layout.local:
                    return False
                location = self.presence.get(player)
                event = Speech(id=event_id(ctx.run_id, player, tick, _OUTSIDE_SEQ + seq), tick=tick, location=location,
                               speaker=player, to=to, text=text, from_player=True, input_id=input_id)
                self._emit_player(location, event)
                ctx.stats.player_inputs += 1
            case Presence(player=player, location=None):
                self.presence.pop(player, None)
            case Presence(player=player, location=str(location)):
                self.presence[player] = location
            case GameEvent(seq=seq, location=location, text=text, significance=significance):
                if location not in ctx.layout.places:
                    return False
                notice = Notice(id=event_id(ctx.run_id, "game", tick, _OUTSIDE_SEQ + seq), tick=tick,
                                location=location, text=text, significance=significance)
                ctx.outbox.emit(ctx.location_topic(location), notice)
            case GameFact():
                return await self._add_fact(taken)
        return True

    async def _add_fact(self, fact: GameFact) -> bool:
        """Add a canonical fact to its NPC (or every NPC of the shard) with the game system's
        authority; refused, with nothing added, when one of them holds its id already."""
        ctx, store = self._ctx, self._ctx.store
        local = ctx.layout.local
        if fact.npc is not None and fact.npc not in local:
            return False
        agents = [fact.npc] if fact.npc is not None else [s.id for s in ctx.specs]
        holder = next((a for a in agents if store.fact_text(a, fact.id) is not None), None)
        if holder is not None:
            if fact.npc is not None or ctx.layout.index == 0:  # one reply: the NPC's shard, or shard 0
                why = f"NPC {holder!r} holds a fact {fact.id!r} already; canonical facts are add-only"
                await self._answer(refused("exists", topics.game_fact(ctx.run_id), why, input_id=fact.id))
            ctx.bus.refuse("game fact that exists", topics.game_fact(ctx.run_id), f"fact {fact.id!r}")
            return False
        for n, agent in enumerate(agents, start=1):
            await store.add_fact(agent, Fact(id=fact.id, text=fact.text), writer=Writer.GAME)
            if n % _WORLD_SLICE == 0:
                await checkpoint()
        return True

    async def _answer(self, refusal: InputRefused) -> None:
        ctx = self._ctx
        await ctx.bus.publish_error(refusal.player, refusal.error, ctx.clock.now())

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
