"""The contexts: what the shard's machinery shares, and the narrow handle each agent gets.

`ShardContext` holds what the shard's agents share: its plan (the run's identity, config,
scenario and the shard's layout: sim.shard._plan), its parts (bus, pool, store, stats,
metrics, clock), the tick's outbox, the recorder, its agent kinds resolved from the
layout's names (`agent_kinds`, through sim.shard._registry) and the perception of its
places. The phases of the tick are handed only the parts each uses (sim.shard._loop). `state(spec)` is an NPC's
state as a working memory is built from it: the store's hot state with what it heard at
its place merged in (sim.shard._perception).

`AgentContext` is all an agent may do, and nothing more (Mesa's agent handle): read its
mail for the tick, remember what it perceived (with the NPC's authority in the store),
look at who is at its place, and `speak`. It never hands out the bus or the store. It is
made for one turn and dropped after it.

`speak(to, said, turn)` is one act: build the working memory from the agent's state (when it
answers a line, without that line and its memory: they are the input), ask the pool (a
player's turn-1 answer first, ambient chatter last) under the NPC's output policy, publish
the `say` line, emit the `Speech` at the agent's place (the others hear it next tick), store
the line in its dialogue, apply what passed the gates (its beliefs, memories and intent:
sim.shard._proposals), and give the recorder the rest (audit, trace, metrics, counters).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, overload

import msgspec

from sim.bus import Bus
from sim.day import GO_TO
from sim.errors import ConfigError
from sim.inference import InferenceRequest, Pool, Priority, Tokenizer, counted_memory
from sim.memory import (
    KEEP_SIGNIFICANCE,
    Belief,
    Episode,
    Line,
    NpcState,
    WorkingMemoryConfig,
    leave_out_event,
    recalled_for,
    with_recalled,
)
from sim.metrics import MetricsSink, NullMetrics
from sim.protocol.outbox import Outbox
from sim.protocol.received import refused
from sim.scenario import NpcSpec
from sim.shard._clock import Clock, SystemClock
from sim.shard._early import EarlyMail
from sim.shard._perception import EpisodeOf, Perception
from sim.shard._plan import ShardPlan
from sim.shard._proposals import apply_proposals
from sim.shard._recorder import Recorder, Spoken
from sim.shard._registry import AGENT_KINDS, Agent, resolve
from sim.shard._stats import RunStats
from sim.store import Store, Writer
from sim.wire import topics
from sim.wire.events import AnyEvent, Notice, SayMessage, Speech, event_id

__all__ = ["AgentContext", "AgentFactory", "AgentKind", "MemoryConfigOf", "ShardContext", "agent_kinds"]

MemoryConfigOf = Callable[[str, int], WorkingMemoryConfig]
"""An NPC's working-memory config at a tick, (npc, tick) -> config: a fork changes it from a tick on (sim.replay)."""

_NO_METRICS = NullMetrics()  # keeps nothing, so one instance serves every shard without metrics


class ShardContext:
    """What a shard's agents share: its plan and parts; `agent_context(spec)` makes an agent's handle.

    `tick` is the tick being stepped (the shard sets it as each tick begins).
    `memory_config_of` gives each NPC's working-memory config at a tick; by default the
    scenario's, for every NPC at every tick. `tokenizer` is the server's that the NPCs'
    token budgets are counted with (`tokenizer = "server"`), fetched before each build.
    """

    def __init__(
        self,
        plan: ShardPlan,
        bus: Bus,
        pool: Pool,
        store: Store,
        stats: RunStats,
        metrics: MetricsSink = _NO_METRICS,
        *,
        clock: Clock | None = None,
        memory_config_of: MemoryConfigOf | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.plan = plan
        self.scenario, self.config, self.run_id, self.seed = plan.scenario, plan.config, plan.run_id, plan.seed
        self.bus = bus
        self.pool = pool
        self.store = store
        self.stats = stats
        self.metrics: MetricsSink = metrics
        self.clock: Clock = clock or SystemClock()
        self.layout = plan.layout
        self.shard = plan.shard
        self.specs = self.layout.specs
        self.kinds = agent_kinds(self.layout.kinds)
        scenario = plan.scenario
        self.memory_config_of = memory_config_of or (lambda _npc, _tick: scenario.memory)
        self.tokenizer = tokenizer
        self.npc_location = self.layout.npc_location
        self.whereabouts = self.layout.whereabouts
        self.chosen: list[tuple[str, str]] = []
        """The moves this shard's NPCs chose in the tick under way (`go_to`), for its TickDone."""
        self.location_topic = plan.location_topic
        # retention prunes place rows by the windows
        window = max(self.config.record.retain_memories or 0, store.hot_limit)
        self.perception = Perception(self.layout.places, limit=store.hot_limit, window=window,
                                     owned=self.layout.owned)
        self.early = EarlyMail()  # outside players' input, for its addressee's turn in the tick that takes it
        self.outbox = Outbox(self.shard, bus.config.run_key)
        self.recorder = Recorder(
            run_id=plan.run_id, shard=self.shard, store=store, bus=bus, metrics=metrics,
            npc_location=self.npc_location,
            keep_dialogue=self.config.record.keep_dialogue, trace_prompts=self.config.record.trace_prompts,
        )
        stats.recorded = self.recorder.counts  # read, never copied
        self.tick = 0

    def neighbours(self, location: str) -> Sequence[str]:
        """Every NPC at `location`, in any shard, in id order."""
        return self.whereabouts.at(location)

    def agent_context(self, spec: NpcSpec) -> AgentContext:
        return AgentContext(self, spec)

    def agent(self, spec: NpcSpec) -> Agent:
        """The agent of `spec`'s kind, for one turn, with its handle."""
        return self.kinds[spec.kind].build(spec, AgentContext(self, spec))

    def state(self, spec: NpcSpec) -> NpcState:
        """The NPC's state now: its own hot state, with the place's log it heard merged into
        its episodic memory (one copy per place, not per listener)."""
        own = self.store.state(spec.id)
        place = self.npc_location[spec.id]
        episodic = self.perception.episodic(spec.id, place, own.episodic, self.kinds[spec.kind].episode_of)
        scene = self.whereabouts.scene(spec.id, self.tick, go_to=GO_TO in spec.intents)
        if scene:
            world = {w.key: w for w in own.world_state}
            world.update((w.key, w) for w in scene)
            return msgspec.structs.replace(own, episodic=episodic, world_state=tuple(world.values()))
        return own if episodic is own.episodic else msgspec.structs.replace(own, episodic=episodic)


    def recalled(self, spec: NpcSpec, state: NpcState, said: str, to: str, config: WorkingMemoryConfig,
                 answering: str | None) -> tuple[Episode, ...]:
        """What the NPC recalls for what `to` said from everything it kept: its significant
        episodes and its place's summaries (`sim.memory.recalled_for`)."""
        home = self.npc_location[spec.id] == spec.location  # a place's summaries are its owner's
        kept = (*self.store.kept(spec.id), *(self.perception.summaries(spec.location) if home else ()))
        return recalled_for(state, kept, said, config, speaker=to, answering=answering)

    async def keep_notices(self, place: str, events: Sequence[AnyEvent]) -> None:
        """A significant notice at `place` is kept by each of this shard's NPCs there (its kind's
        memory of it): what the game announced is never only in a summary."""
        for event in events:
            if isinstance(event, Notice) and event.significance >= KEEP_SIGNIFICANCE:
                for npc in sorted(self.perception.listeners(place)):
                    spec = self.layout.by_id[npc]
                    await self.store.keep(npc, self.kinds[spec.kind].episode_of(event, False), writer=Writer.NPC)


AgentFactory = Callable[[NpcSpec, "AgentContext"], Agent]


class AgentKind(NamedTuple):
    """A kind of agent: how to build one for a turn, and what one remembers of an event."""

    build: AgentFactory
    episode_of: EpisodeOf


def agent_kinds(named: Mapping[str, str]) -> dict[str, AgentKind]:
    """The kinds `named` (kind, to the NPC that names it) as `AGENT_KINDS` resolves them;
    ConfigError names the NPC of an unknown or incomplete kind."""
    kinds: dict[str, AgentKind] = {}
    for kind, npc in named.items():
        path = AGENT_KINDS.get(kind)
        if path is None:
            raise ConfigError(f"npc {npc!r}: unknown kind {kind!r}; known: {sorted(AGENT_KINDS)}")
        build = resolve(path)
        episode_of = getattr(build, "episode_of", None)  # resolved once: the same function for every NPC
        if not callable(episode_of):
            raise ConfigError(f"npc {npc!r}: kind {kind!r} ({path}) has no episode_of(event, addressed)")
        kinds[kind] = AgentKind(build, episode_of)
    return kinds


class AgentContext:
    """One agent's handle on the engine: its mail, its memory, its place, its voice."""

    __slots__ = ("_seq", "_seq_tick", "_shard", "_spoken", "spec")

    def __init__(self, shard: ShardContext, spec: NpcSpec) -> None:
        self._shard = shard
        self.spec = spec
        self._seq_tick = -1
        self._seq = 0
        self._spoken = (-1, 0)  # (tick, inferences made in it)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def seed(self) -> int:
        """The run's seed: an agent's dice are a function of (seed, id, tick)."""
        return self._shard.seed

    # --- perceiving ----------------------------------------------------------------------

    async def mail(self, tick: int) -> list[AnyEvent]:
        """What was said to this agent before `tick`, and what outside players said to it in
        `tick` (answered at once: sim.shard._early), sorted by (tick, id); later mail stays.

        Mail said at its place is in the place's log already (or will be, this tick); mail
        that came to its inbox becomes its private memory here (what its kind remembers of
        it), once.
        """
        shard, spec = self._shard, self.spec
        at_place, direct = shard.early.take(spec.id)
        heard: list[AnyEvent] = [*shard.perception.take_mail(spec.id), *at_place]
        inbox: list[AnyEvent] = [*shard.bus.mail.take_mail(spec.id, tick), *direct]
        episode_of = shard.kinds[spec.kind].episode_of
        for event in inbox:
            if not (isinstance(event, Speech) and event.speaker == spec.id):
                episode = episode_of(event, isinstance(event, Speech) and event.to == spec.id)
                await shard.store.add_episode(spec.id, episode, writer=Writer.NPC)
        for event in heard:  # said to it at its place: the place's log holds it, its own memory keeps it
            await shard.store.keep(spec.id, episode_of(event, True), writer=Writer.NPC)
        if not heard and not direct:
            return inbox
        return sorted((*heard, *inbox), key=lambda e: (e.tick, e.id))

    def neighbours(self) -> Sequence[str]:
        """The other NPCs at this agent's place, in any shard, in id order (a view: no copy of
        a place of thousands for each NPC that talks there)."""
        shard = self._shard
        return _Others(shard.neighbours(shard.npc_location[self.spec.id]), self.spec.id)

    @property
    def location(self) -> str:
        """Where the agent stands now."""
        return self._shard.npc_location[self.spec.id]

    def is_npc(self, agent_id: str) -> bool:
        return agent_id in self._shard.npc_location

    # --- remembering ---------------------------------------------------------------------

    def next_seq(self) -> int:
        """The next number of this agent's sequence in the tick (1, 2, ...; it restarts each tick):
        it orders the dialogue lines of the tick and names the inferences."""
        tick = self._shard.tick
        if tick != self._seq_tick:
            self._seq_tick, self._seq = tick, 0
        self._seq += 1
        return self._seq

    async def remember(self, memory: Belief | Line) -> None:
        """Keep a belief or a dialogue line, with the NPC's authority (episodes of what it
        perceived are the engine's: its place's log, or its `mail`)."""
        store = self._shard.store
        if isinstance(memory, Belief):
            await store.add_belief(self.spec.id, memory, writer=Writer.NPC)
        else:
            await store.add_line(self.spec.id, memory, writer=Writer.NPC)

    # --- speaking ------------------------------------------------------------------------

    async def speak(self, to: str, said: str, turn: int, *, reply_to: str | None = None,
                    answering: str | None = None) -> str | None:
        """Answer `said` (what `to` said, or an ambient prompt) to `to`; returns the line said,
        or None when the NPC made its `npc_inferences_per_tick` inferences of this tick already
        (counted, nothing said: a flood of talk costs a bounded number of model calls).

        `turn` counts the replies of an exchange: 0 is ambient chatter, 1 an answer. The `say`
        of an answer to a player names the player (`in_reply_to`) and carries `reply_to`, the
        id its client gave the input (`Speech.input_id`). `answering` is the id of the event
        `said` was said in: its line and its memory are left out of the state, since `said` is
        the input (a prompt says nothing twice). Never raises for a model failure: the pool's
        fallback line is said then.
        """
        shard, spec = self._shard, self.spec
        tick = shard.tick
        made = self._spoken[1] if self._spoken[0] == tick else 0
        if made >= shard.config.limits.bounds.npc_inferences_per_tick:
            why = f"{spec.id!r} made {made} inferences in tick {tick} already"
            shard.bus.refuse("inferences over the per-NPC bound", spec.id, why)
            if turn == 1 and to not in shard.npc_location:  # a player's question: told, never left unanswered
                topic = topics.player_input(shard.run_id, to)
                await shard.bus.publish_error(to, refused("busy", topic, f"{why}; try again", player=to, npc=spec.id,
                                                          input_id=reply_to).error, shard.clock.now())
            return None
        self._spoken = (tick, made + 1)
        state = shard.state(spec)
        if answering is not None:
            state = leave_out_event(state, answering)
        config = shard.memory_config_of(spec.id, tick)
        recalled = shard.recalled(spec, state, said, to, config, answering)
        state = with_recalled(state, recalled)
        memory, counts = await counted_memory(state, said, config, shard.tokenizer)
        seq = self.next_seq()
        inference_id = event_id(shard.run_id, spec.id, tick, seq)
        player = turn == 1 and to not in shard.npc_location
        priority = Priority.PLAYER if player else Priority.AMBIENT if turn == 0 else Priority.NPC
        request = InferenceRequest(
            id=inference_id,
            run_id=shard.run_id,
            agent_id=spec.id,
            tick=tick,
            memory=memory,
            deadline=shard.clock.wall() + shard.config.inference.inference_timeout,
            priority=priority,
            fallback_lines=tuple(spec.fallback_lines),
            seed=shard.seed,
            shard=shard.shard,
            state=state,
            config=config,
            output=spec.policy(),
        )
        result = await shard.pool.infer(request)
        say = SayMessage(run=shard.run_id, agent=spec.id, tick=tick, to=to, text=result.line, inference_id=inference_id,
                         reply_to=reply_to if player else None, in_reply_to=to if player else None)
        await shard.bus.send("say", say)
        place = shard.npc_location[spec.id]
        shard.outbox.emit(
            shard.location_topic(place),
            Speech(id=inference_id, tick=tick, location=place, speaker=spec.id, to=to, text=result.line,
                   turn=turn),
        )
        await shard.store.add_line(spec.id, Line(tick=tick, speaker=spec.id, text=result.line, seq=seq,
                                                 event=inference_id), writer=Writer.NPC)
        await apply_proposals(shard.store, shard.bus, run_id=shard.run_id, state=state, result=result,
                              reply_to=say.reply_to, moves=shard.chosen)
        spoken = Spoken(say=say, state=state, config=config, memory=memory, result=result,
                        output=request.output, rules=shard.pool.config.rules, counts=counts,
                        recalled=tuple(e.id for e in recalled))
        await shard.recorder.record(spoken)
        return result.line


class _Others(Sequence[str]):
    """The ids of a place's NPCs in id order, but one: a sorted tuple seen with a gap."""

    __slots__ = ("_all", "_gap")

    def __init__(self, everyone: Sequence[str], but: str) -> None:
        self._all = everyone
        at = bisect.bisect_left(everyone, but)
        self._gap = at if at < len(everyone) and everyone[at] == but else len(everyone)

    def __len__(self) -> int:
        return len(self._all) - (self._gap < len(self._all))

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._all[index + (index >= self._gap)]
