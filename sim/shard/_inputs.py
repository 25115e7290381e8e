"""The tick's first phase: what comes from outside the NPCs, as events.

A tick takes, in this order: the world-state changes due at its start, its scripted and
bot players' inputs (functions of seed and tick), the players' presence and the facts for
every NPC due (these three announced by shard 0's TickDone of the tick before, so every
shard takes them at the same tick), and the outside clients' input for this shard that
arrived before this point; each is stored with the tick that takes it: players' input (to
an NPC's inbox, or overheard at its place when the game system says the player stands
there), the game system's events (a `Notice` at the place) and canonical facts (added with
the game system's authority; a fact id an NPC holds already is refused). A player's input
is its addressee's mail in this same tick (sim.shard._early): it answers at once.

Where outside input and world changes come from is an `InputSource`: `LiveInputs` takes
what arrives on the bus (journaled and held for its tick as it arrives, held to its
per-tick bound; a resume's journal for the ticks not committed); a re-execution takes what
the recorded run took (`RecordedInputs`: the store keeps each outside input and world-state
change with the tick it took effect at, and a shard given these takes them at those ticks,
with the numbers the run gave them, and nothing that arrives on its bus, so the run is
executed again exactly).
The tick calls either the same way. `RunWideInputs` holds what every shard applies at the
same tick in one place: what arrived for each tick's TickDone, what is due next tick.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import NamedTuple, Protocol

import msgspec

from sim.bus import Bus
from sim.memory import WorldFact
from sim.protocol.bounds import InputBounds, limit_player_inputs
from sim.protocol.outbox import Outbox
from sim.protocol.outside import Arrival, InputArrival, OutsideJournal, RunWideArrival, WorldArrival
from sim.protocol.received import InputRefused, OutsideReceived, refused
from sim.shard._clock import Clock, checkpoint
from sim.shard._early import OUTSIDE_SEQ, EarlyMail
from sim.shard._facts import GameFacts
from sim.shard._plan import ShardPlan
from sim.shard._registry import Player
from sim.shard._stats import InputCounts
from sim.store import Store, Writer
from sim.wire import topics
from sim.wire.events import Notice, Speech, event_id
from sim.wire.inputs import GameEvent, GameFact, Goal, Move, OutsideInput, Presence, RunWide, Taken

__all__ = ["InputSource", "LiveInputs", "RecordedInputs", "RunWideChanges", "RunWideInputs", "TickInputs"]

_WORLD_SLICE = 20_000  # NPCs whose world state or facts are set between two yields


class RunWideChanges(NamedTuple):
    """What every shard applies at one tick: the world-state changes (None when nothing
    changed) and the presence and facts for every NPC, in the order shard 0 took them."""

    world: dict[str, str] | None
    inputs: tuple[RunWide, ...]


class RunWideInputs:
    """What every shard applies at the same tick (world-state changes, players' presence,
    facts for every NPC) as one shard holds it: what arrived for each tick's TickDone (shard
    0 announces it there), and what is due at the start of the next tick (the barrier's, or
    what the last commit left)."""

    def __init__(self) -> None:
        self._world: dict[int, list[dict[str, str]]] = {}
        self._inputs: dict[int, list[RunWide]] = {}
        self.world: dict[str, str] | None = None
        """The world-state changes due at the start of the next tick."""
        self.inputs: tuple[RunWide, ...] = ()
        """The presence and facts for every NPC due at the next tick, in the order shard 0 took them."""
        self.moves: list[tuple[str, str]] = []
        """The moves every shard's NPCs chose in the last tick (their TickDones), due at the next."""

    def hold(self, arrival: WorldArrival | RunWideArrival) -> None:
        """What arrived for the TickDone of the tick it is stamped with."""
        match arrival:
            case WorldArrival(tick=tick, state=state):
                self._world.setdefault(tick, []).append(state)
            case RunWideArrival(tick=tick, input=taken):
                self._inputs.setdefault(tick, []).append(taken)

    def announce(self, tick: int) -> RunWideChanges:
        """What the TickDone of `tick` announces: what arrived for it, in the order it came (of
        the world state, the later key wins)."""
        world: dict[str, str] = {}
        for state in self._world.pop(tick, []):
            world.update(state)
        return RunWideChanges(world or None, tuple(self._inputs.pop(tick, [])))

    def take_due(self) -> RunWideChanges:
        """What is due at the start of the next tick, taken."""
        due = RunWideChanges(self.world, self.inputs)
        self.world, self.inputs = None, ()
        return due


class InputSource(Protocol):
    """Where a tick's outside input and world-state changes come from."""

    def journal(self, event: OutsideReceived) -> None:
        """An outside input, as the bus receives it: kept for the tick that takes it, if this shard takes it."""

    def close_inputs(self, tick: int) -> None:
        """Tick `tick` takes the input that arrived until now; what arrives later is the next one's."""

    def close_done(self, tick: int) -> None:
        """The TickDone of `tick` takes what every shard applies that arrived until now."""

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        """The world-state changes set at the start of `tick` (`announced`: by the barrier)."""

    def inputs_at(self, tick: int, announced: tuple[RunWide, ...]) -> list[Taken]:
        """The outside inputs `tick` takes, numbered: the run-wide ones first (`announced`: by
        the barrier), then this shard's own."""

    def take_refused(self) -> list[InputRefused]:
        """The inputs refused since the last call (over the per-tick bound), to be answered."""

    def waiting(self, tick: int) -> bool:
        """Whether outside input this shard takes itself waits for `tick` (a player's input, a
        game event, a fact for one NPC): the tick may begin before the pace. What every shard
        applies waits for the tick's TickDone, and takes effect a tick later: it keeps the pace."""


class LiveInputs:
    """Outside input from the bus, as it arrives: stamped with the tick that takes it (its
    input phase, or its TickDone: `OutsideJournal`, which also says which this shard takes),
    journaled with that stamp (sim.store's arrivals) and held for that tick (what every
    shard applies in `run_wide`, until shard 0's TickDone announces it); held to its
    per-tick bound (the excess refused, `take_refused`), numbered in the order taken.

    A resumed shard holds what its journal kept for the ticks not committed, and stamps what
    arrives from then on for the tick after its first: the first tick takes exactly what it
    took before the kill, so what it may have sent then (batches, a TickDone the other
    shards acted on) is sent again the same."""

    def __init__(self, store: Store, bus: Bus, run_wide: RunWideInputs, *, journal: OutsideJournal,
                 bounds: InputBounds) -> None:
        self._store, self._bus, self._run_wide = store, bus, run_wide
        self._stamps = journal
        self._bounds = bounds
        self._held: dict[int, list[Taken]] = {}
        self._refused: list[InputRefused] = []
        self._taken: tuple[int, list[Taken]] = (-1, [])  # the last tick's inputs, as taken
        self.join: Callable[[OutsideInput], int | None] | None = None
        """Whether a player's input joins the turns under way: their tick, or None (sim.shard._turns)."""
        for arrival in store.arrivals.pending:  # a tick cut short (kill -9) takes them again
            self._hold(arrival)

    def journal(self, event: OutsideReceived) -> None:
        arrival = self._stamps.stamp(event)  # None: another shard's, or a retained world state
        if arrival is None:
            return
        if isinstance(arrival, InputArrival) and isinstance(arrival.input, OutsideInput) and self.join is not None:
            tick = self.join(arrival.input)
            if tick is not None:  # taken by the tick under way, journaled with it
                self._store.arrivals.add(msgspec.structs.replace(arrival, tick=tick))
                return
        self._store.arrivals.add(arrival)
        self._hold(arrival)

    def admit(self, tick: int, player_input: OutsideInput) -> OutsideInput | None:
        """`player_input` numbered after what `tick` took, when the tick's bounds admit it; None
        when they do not (it waits for the next tick). The bounds count in arrival order, so it
        is what the tick's inputs phase keeps when it holds the input from the start."""
        taken_at, taken = self._taken
        if taken_at != tick:
            return None
        kept, _ = limit_player_inputs([*taken, player_input], self._bounds)
        if len(kept) == len(taken):
            return None
        numbered = msgspec.structs.replace(player_input, seq=len(taken))
        taken.append(numbered)
        return numbered

    def _hold(self, arrival: Arrival) -> None:
        match arrival:
            case InputArrival(tick=tick, input=taken):
                self._held.setdefault(tick, []).append(taken)
            case WorldArrival() | RunWideArrival():
                self._run_wide.hold(arrival)

    def close_inputs(self, tick: int) -> None:
        self._stamps.inputs_taken(tick)

    def close_done(self, tick: int) -> None:
        self._stamps.done_taken(tick)

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        return announced

    def inputs_at(self, tick: int, announced: tuple[RunWide, ...]) -> list[Taken]:
        arrived = [*announced, *self._held.pop(tick, [])]
        taken, over = limit_player_inputs(arrived, self._bounds)
        for player_input, code, why in over:
            kind = "player inputs over the per-tick bound" if code == "rate_limited" else "player inputs to a busy NPC"
            self._bus.refuse(kind, f"player {player_input.player!r}", why)
            topic = topics.player_input(self._bus.config.run, player_input.player)
            self._refused.append(refused(code, topic, why, player=player_input.player,
                                         npc=player_input.to, input_id=player_input.id))
        numbered = [msgspec.structs.replace(t, seq=seq) for seq, t in enumerate(taken)]
        self._taken = (tick, list(numbered))
        return numbered

    def take_refused(self) -> list[InputRefused]:
        refusals, self._refused = self._refused, []
        return refusals

    def waiting(self, tick: int) -> bool:
        return bool(self._held.get(tick))


class RecordedInputs(msgspec.Struct, frozen=True, kw_only=True):
    """The input source of a re-execution: `inputs[tick]`, the outside inputs the run took
    at that tick, in seq order (every shard's: each shard takes its own NPCs'; the run-wide
    ones once, every shard's store holds the same); `world[tick]`, the keys and values set
    at the start of that tick."""

    inputs: dict[int, list[Taken]] = {}
    world: dict[int, dict[str, str]] = {}

    def journal(self, event: OutsideReceived) -> None:
        pass  # nothing live is taken, so nothing is journaled

    def close_inputs(self, tick: int) -> None:
        pass

    def close_done(self, tick: int) -> None:
        pass

    def world_at(self, tick: int, announced: dict[str, str] | None) -> dict[str, str] | None:
        return self.world.get(tick)

    def inputs_at(self, tick: int, announced: tuple[RunWide, ...]) -> list[Taken]:
        return self.inputs.get(tick, [])

    def take_refused(self) -> list[InputRefused]:
        return []

    def waiting(self, tick: int) -> bool:
        return bool(self.inputs.get(tick))


class TickInputs:
    """Phase 1: the world-state changes due, the players' inputs and the outside inputs of a
    tick, as events in its outbox (and in the store, with the tick that takes them)."""

    def __init__(self, plan: ShardPlan, store: Store, bus: Bus, outbox: Outbox, clock: Clock, source: InputSource,
                 run_wide: RunWideInputs, take_events: Callable[[], Awaitable[None]], early: EarlyMail) -> None:
        """`take_events`: what the bus queued, acted on (sim.shard._intake); `early`: players'
        input for its addressee's turn in this tick."""
        self._plan, self._store, self._bus, self._outbox, self._clock = plan, store, bus, outbox, clock
        self._early = early
        self.counts = InputCounts()
        self._source, self._run_wide, self._take_events = source, run_wide, take_events
        self.players: list[Player] = []  # shard 0's scripted and bot players (set at start)
        self.presence: dict[str, str] = {}
        """Where each outside player stands, as the game system said (kept with each tick's commit)."""
        self.facts = GameFacts(plan, store, bus, self._answer)
        self.move: Callable[[int, list[tuple[str, str]]], Awaitable[None]] | None = None
        """Moves everyone at the start of a tick, given the chosen and the game's moves (the
        shard's `Movements.advance`): after what is due is known, before anyone is heard."""

    async def take(self, tick: int) -> None:
        plan, counts, store = self._plan, self.counts, self._store
        self._early.clear()
        due = self._run_wide.take_due()
        world = self._source.world_at(tick, due.world)
        if world:
            counts.world_changes += await _apply_world_state(store, (s.id for s in plan.layout.specs), world)
            await store.resume.record_world(tick, world)
        for player in self.players:
            for event in player.inputs(tick):
                self._emit_player(player.location, event)
                counts.player_inputs += 1
        self._source.close_inputs(tick)  # what arrived until now is this tick's input
        await self._take_events()
        inputs = self._source.inputs_at(tick, due.inputs)
        if self.move is not None:
            moves, self._run_wide.moves = self._run_wide.moves, []
            await self.move(tick, [*moves, *((m.npc, m.location) for m in inputs if isinstance(m, Move))])
        for taken in inputs:
            if await self._take(tick, taken):
                await store.resume.record_input(tick, taken)
        for refusal in self._source.take_refused():
            await self._answer(refusal)

    async def take_joined(self, tick: int, player_input: OutsideInput) -> None:
        """A player's input that joined the turns of `tick` under way (`LiveInputs.admit`), taken
        as the tick's inputs phase takes it."""
        if await self._take(tick, player_input):
            await self._store.resume.record_input(tick, player_input)

    async def _take(self, tick: int, taken: Taken) -> bool:
        """Act on one outside input; whether this shard took it (a recorded run's input for
        another shard's NPC or place, or a fact refused, is not)."""
        plan = self._plan
        match taken:
            case OutsideInput(seq=seq, player=player, to=to, text=text, id=input_id):
                if to not in plan.layout.local:
                    return False
                location = self.presence.get(player)
                event = Speech(id=event_id(plan.run_id, player, tick, OUTSIDE_SEQ + seq), tick=tick, location=location,
                               speaker=player, to=to, text=text, from_player=True, input_id=input_id)
                if self._emit_player(location, event, inbox=False):
                    self._early.put(event, at_place=True)
                else:
                    self._early.put(msgspec.structs.replace(event, location=None), at_place=False)
                self.counts.player_inputs += 1
            case Presence(player=player, location=None):
                self.presence.pop(player, None)
            case Presence(player=player, location=str(location)):
                self.presence[player] = location
            case GameEvent(seq=seq, location=location, text=text, significance=significance):
                if location not in plan.layout.owned:
                    return False
                notice = Notice(id=event_id(plan.run_id, "game", tick, OUTSIDE_SEQ + seq), tick=tick,
                                location=location, text=text, significance=significance)
                self._outbox.emit(plan.location_topic(location), notice)
            case GameFact():
                return await self.facts.take(taken)
            case Goal(npc=npc, goal=goal):
                if npc not in plan.layout.local:
                    return False
                await self.facts.set_goal(npc, goal)
        return True

    async def _answer(self, refusal: InputRefused) -> None:
        await self._bus.publish_error(refusal.player, refusal.error, self._clock.now())

    def _emit_player(self, location: str | None, event: Speech, *, inbox: bool = True) -> bool:
        """A player standing at the NPC's place is overheard there (True); otherwise it is a
        direct message, to the NPC's inbox unless `inbox` is false (its addressee has it already)."""
        plan = self._plan
        if event.to is None:
            raise ValueError(f"player event {event.id!r} has no addressee")
        if location is not None and location == plan.layout.npc_location.get(event.to):
            self._outbox.emit(plan.location_topic(location), event)
            return True
        if inbox:
            self._outbox.emit(topics.agent_inbox(plan.run_id, event.to), msgspec.structs.replace(event, location=None))
        return False


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
