"""A shard: scenario + store + bus + inference pool + agents under one TaskGroup.

The tick is the clock. Each tick:
1. players' inputs (scripted, bots, and outside clients' JSON) become events;
2. the local agents that have mail or want to talk are woken, in id order, and the
   tick waits for all of them (each agent is a long-lived task);
3. the tick's events go out as one msgpack batch per topic, and the shard waits until its
   own batches come back through the broker (bounded by `echo_timeout`), so the next
   tick perceives them whatever the network's interleaving;
4. the store commits the tick; the status topic says where the shard is.

Shutdown (SIGINT/SIGTERM, or the last tick): no new tick starts, the current one's
inferences finish (bounded by `shutdown_timeout`), the store is flushed, the retained
status says "offline", and the run returns normally.

`sim` never imports `agents` by name: NPC kinds resolve through AGENT_KINDS import strings.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from sim import startup, topics
from sim.audit import AuditRecord, make_record
from sim.bounds import InputBounds
from sim.broker import open_broker
from sim.bus import Bus, BusConfig, open_bus
from sim.errors import ConfigError, single_error
from sim.events import PlayerInputMessage, SayMessage, Speech, StatusMessage, WorldStateMessage, event_id
from sim.inference import InferenceRequest, InferenceResult, Pool, PoolConfig, Priority, open_pool
from sim.memory import Belief, Episode, Line, NpcState, WorkingMemory, WorkingMemoryConfig, WorldFact
from sim.metrics import Metrics
from sim.mqtt import BrokerAddress, TlsFiles
from sim.scenario import NpcSpec, Scenario
from sim.store import HOT_LIMIT, Store, Writer, open_store
from sim.trace import RosterEntry, RosterMessage, encode_roster, encode_trace, trace_of
from sim.trust import announce_trust, limit_player_inputs, run_key_for

__all__ = [
    "AGENT_KINDS", "Agent", "RunConfig", "RunStats", "ShardContext", "hot_limit", "parse_shard", "run", "shard_npcs",
]

log = logging.getLogger(__name__)

AGENT_KINDS: dict[str, str] = {"npc": "agents.npc:NpcAgent"}
PLAYER_KINDS = {"scripted": "agents.player:ScriptedPlayer", "bot": "agents.player:BotPlayer"}


class Agent(Protocol):
    id: str

    def wants_turn(self, tick: int) -> bool: ...

    async def step(self, tick: int) -> None: ...


class _Player(Protocol):
    id: str
    location: str | None

    def inputs(self, tick: int) -> list[Speech]: ...


class RunConfig(msgspec.Struct, frozen=True, kw_only=True):
    scenario: str
    broker: str = "auto"
    broker_tls: TlsFiles = msgspec.field(default_factory=TlsFiles)
    bounds: InputBounds = msgspec.field(default_factory=InputBounds)
    run_key_file: str | None = None
    ticks: int | None = None
    tick_ms: int = 0
    seed: int | None = None
    run_id: str | None = None
    db: str | None = None
    backend: str = "scripted"
    backend_options: dict[str, Any] = msgspec.field(default_factory=dict)
    remote_workers: bool = False
    shard: str = "0/1"
    resume: bool = False
    concurrency: int = 64
    bots: int = 0
    bot_rate: float = 0.1
    echo_timeout: float = 5.0
    shutdown_timeout: float = 10.0
    inference_timeout: float = 30.0
    keep_dialogue: bool = False
    trace_prompts: bool = True  # the trace topic carries each prompt (off: report and digest only)
    retain_memories: int | None = None  # prune memories past each agent's newest N per category; None keeps all

    def __post_init__(self) -> None:
        """The library's boundary: the same values the CLI refuses are refused here, by option name."""
        minimum = {"ticks": 1, "tick_ms": 0, "concurrency": 1, "bots": 0, "retain_memories": 1}
        for name, low in minimum.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"--{name.replace('_', '-')} must be a whole number >= {low}, got {value!r}")
        for name in ("inference_timeout", "echo_timeout", "shutdown_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise ConfigError(f"--{name.replace('_', '-')} must be a number of seconds > 0, got {value!r}")


@dataclass
class RunStats:
    """What the progress display and the summary read; updated by the shard."""

    run_id: str = ""
    shard: str = "0"
    broker: str = ""
    broker_address: BrokerAddress | None = None  # with the shard's login: `run --view` follows the run with it
    agents: int = 0
    first_tick: int = 0
    tick: int = -1
    last_tick: int = 0
    inferences: int = 0
    fallbacks: int = 0
    over_budget: int = 0  # working memories whose mandatory content alone exceeded the limit
    lines: int = 0
    player_inputs: int = 0
    late_echoes: int = 0
    world_changes: int = 0
    memories_pruned: int = 0  # rows deleted by --retain-memories
    started: float = field(default_factory=time.monotonic)
    bus: Any = None
    stopped_by_signal: bool = False
    startup_progress: startup.StartupProgress = field(default_factory=startup.StartupProgress)
    dialogue: list[SayMessage] = field(default_factory=list)


def parse_shard(value: str) -> tuple[int, int]:
    """`i/n` with 0 <= i < n."""
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError as exc:
        raise ConfigError(f"--shard {value!r}: expected i/n, for example 0/2") from exc
    if not 0 <= index < count:
        raise ConfigError(f"--shard {value!r}: need 0 <= i < n")
    return index, count


def shard_npcs(scenario: Scenario, index: int, count: int) -> list[NpcSpec]:
    """Shard i of n holds every n-th NPC in id order: a function of the scenario only."""
    return [spec for k, spec in enumerate(sorted(scenario.npcs, key=lambda s: s.id)) if k % count == index]


def _resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


# --- the shard ---------------------------------------------------------------------------------


class ShardContext:
    """What an agent may use: the bus, its state, the pool, and the run's identity."""

    def __init__(
        self,
        scenario: Scenario,
        config: RunConfig,
        run_id: str,
        seed: int,
        bus: Bus,
        pool: Pool,
        store: Store,
        stats: RunStats,
        metrics: Metrics | None = None,
    ) -> None:
        self.scenario = scenario
        self.metrics = metrics
        self.run_id = run_id
        self.seed = seed
        self.shard = stats.shard
        self.bus = bus
        self.stats = stats
        self.memory_config: WorkingMemoryConfig = scenario.memory
        self.npc_ids = frozenset(spec.id for spec in scenario.npcs)
        neighbours: dict[str, list[str]] = {}
        for spec in sorted(scenario.npcs, key=lambda s: s.id):
            neighbours.setdefault(spec.location, []).append(spec.id)
        self._neighbours = {location: tuple(ids) for location, ids in neighbours.items()}
        self._location_topics = {loc.id: topics.location_events(run_id, loc.id) for loc in scenario.locations}
        self.store = store
        self._pool = pool
        self._inference_timeout = config.inference_timeout
        self._keep_dialogue = config.keep_dialogue
        self._trace_prompts = config.trace_prompts
        self._trace_topic = topics.trace(run_id, stats.shard)
        self.npc_location = {spec.id: spec.location for spec in scenario.npcs}
        self._over_budget_logged: set[str] = set()

    def neighbours(self, location: str) -> tuple[str, ...]:
        """Every NPC at `location`, in any shard, in id order."""
        return self._neighbours.get(location, ())

    def location_topic(self, location: str) -> str:
        return self._location_topics[location]

    def state(self, agent_id: str) -> NpcState:
        return self.store.state(agent_id)

    async def add_episode(self, agent_id: str, episode: Episode) -> None:
        await self.store.add_episode(agent_id, episode, writer=Writer.NPC)

    async def add_belief(self, agent_id: str, belief: Belief) -> None:
        await self.store.add_belief(agent_id, belief, writer=Writer.NPC)

    async def add_line(self, agent_id: str, line: Line) -> None:
        await self.store.add_line(agent_id, line, writer=Writer.NPC)

    async def infer(
        self,
        *,
        inference_id: str,
        agent: str,
        tick: int,
        memory: WorkingMemory,
        player: bool,
        ambient: bool,
        fallback_lines: tuple[str, ...],
        state: NpcState | None = None,
    ) -> InferenceResult:
        """Ask the pool; players first, ambient chatter last. Never raises for a model failure."""
        priority = Priority.PLAYER if player else Priority.AMBIENT if ambient else Priority.NPC
        self._count_over_budget(agent, memory)
        request = InferenceRequest(
            id=inference_id,
            run_id=self.run_id,
            agent_id=agent,
            tick=tick,
            memory=memory,
            deadline=time.time() + self._inference_timeout,
            priority=priority,
            fallback_lines=fallback_lines,
            seed=self.seed,
            shard=self.shard,
            state=state,
            config=self.memory_config,
        )
        result = await self._pool.infer(request)
        self.stats.inferences += 1
        self.stats.fallbacks += result.fallback
        return result

    def _count_over_budget(self, agent: str, memory: WorkingMemory) -> None:
        """DESIGN.md step 5: an over-budget snapshot is counted, and logged once per NPC."""
        if not memory.report.over_budget:
            return
        self.stats.over_budget += 1
        if agent not in self._over_budget_logged:
            self._over_budget_logged.add(agent)
            report = memory.report
            log.warning(
                "%s: the mandatory content alone (%d chars) exceeds max_context_chars=%d; the prompt is over "
                "budget (counted in the summary; not logged again for this NPC)",
                agent, report.mandatory_chars, report.limit_chars,
            )

    async def say(self, agent: str, tick: int, to: str, text: str, inference_id: str) -> None:
        message = SayMessage(run=self.run_id, agent=agent, tick=tick, to=to, text=text, inference_id=inference_id)
        await self.bus.publish_say(message)
        self.stats.lines += 1
        if self._keep_dialogue:
            self.stats.dialogue.append(message)

    async def record(
        self,
        inference_id: str,
        agent: str,
        tick: int,
        state: NpcState,
        player_input: str,
        memory: WorkingMemory,
        result: InferenceResult,
    ) -> None:
        """One audit record: enough to rebuild the exact context the model saw."""
        record = make_record(
            id=inference_id,
            run_id=self.run_id,
            state=state,
            player_input=player_input,
            config=self.memory_config,
            memory=memory,
            tick=tick,
            backend=result.backend,
            model=result.model,
            params=result.params,
            raw_response=result.raw_response,
            line=result.line,
            fallback=result.fallback,
            fallback_reason=result.fallback_reason,
            timings=result.timings,
            attempts=result.attempts,
        )
        await self.store.record(record)
        await self._trace(record, result)

    async def _trace(self, record: AuditRecord, result: InferenceResult) -> None:
        """Publish the inference's trace (for viewers) and observe it in the metrics."""
        if self.metrics is not None:
            self.metrics.inference(record.report, result.timings.get("total_ms", 0.0) / 1000)
        trace = trace_of(record, shard=self.shard, location=self.npc_location.get(record.agent_id),
                         prompts=self._trace_prompts)
        await self.bus.publish(self._trace_topic, encode_trace(trace))

    async def publish_roster(self, specs: list[NpcSpec]) -> None:
        """Say which NPCs this shard runs and where (retained, for viewers that connect later)."""
        npcs = tuple(RosterEntry(id=s.id, name=s.name, location=s.location) for s in specs)
        message = RosterMessage(run=self.run_id, shard=self.shard, npcs=npcs)
        await self.bus.publish(topics.roster(self.run_id, self.shard), encode_roster(message), retain=True)


async def _apply_world_state(store: Store, agents: list[str], message: WorldStateMessage) -> int:
    """Set what the game system changed, with its authority; returns how many entries changed."""
    changed = 0
    for agent in agents:
        current = {entry.key: entry.value for entry in store.state(agent).world_state}
        for key, value in sorted(message.state.items()):
            if current.get(key) != value:
                await store.set_world(agent, WorldFact(key=key, value=value), writer=Writer.GAME)
                changed += 1
    return changed


def _check_resume(config: RunConfig, db: Path, store: Store) -> None:
    """A database holding ticks is continued only when asked, never silently reused."""
    if config.resume and store.last_tick is None:
        raise ConfigError(f"--resume: {db} holds no committed tick to continue from")
    if not config.resume and store.last_tick is not None:
        raise ConfigError(
            f"--db {db} already holds this run up to tick {store.last_tick}: "
            "pass --resume to continue it, or give another file"
        )


def _check_retention(config: RunConfig, limit: int) -> None:
    """Retention never reaches into what a working memory can use (sim/store/_retention.py);
    checked before anything starts, so a refused run leaves no file behind."""
    if config.retain_memories is not None and config.retain_memories < limit:
        raise ConfigError(
            f"--retain-memories must be at least the store's hot window ({limit} items per category),"
            f" got {config.retain_memories}"
        )


def hot_limit(config: WorkingMemoryConfig) -> int:
    """The store's hot state holds at least what the count caps can use, in every category."""
    return max(HOT_LIMIT, config.max_dialogue_lines, config.max_episodic_memories, config.max_beliefs)


def _default_run_id(scenario: Scenario, seed: int) -> str:
    return f"{scenario.scenario.name}-{seed}"


@contextlib.contextmanager
def _signals(stop: asyncio.Event, stats: RunStats) -> Iterator[None]:
    """SIGINT/SIGTERM ask for an orderly stop; the handlers are removed on exit."""
    loop = asyncio.get_running_loop()

    def handler(signum: int) -> None:
        log.warning("%s: stopping after the current tick", signal.Signals(signum).name)
        stats.stopped_by_signal = True
        stop.set()

    installed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, handler, signum)
        except (NotImplementedError, RuntimeError):
            continue
        installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


@contextlib.asynccontextmanager
async def _workdir() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="npcsim-") as path:
        yield Path(path)


async def run(
    config: RunConfig,
    *,
    stats: RunStats | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[RunStats], None] | None = None,
    metrics: Metrics | None = None,
) -> RunStats:
    """Run one shard to its last tick or until `stop` is set (SIGINT/SIGTERM set it too).

    A stop during start-up cancels the start-up at once (see `sim.startup`); after it, the
    current tick ends first.
    """
    stats = stats or RunStats()
    stop = stop or asyncio.Event()
    index, _ = parse_shard(config.shard)
    stats.shard = str(index)
    with _signals(stop, stats):
        try:
            async with asyncio.TaskGroup() as group:
                main = group.create_task(_run(config, stats, stop, on_ready, metrics), name="run")
                watch = startup.cancel_start_up_on(stop, stats.startup_progress, main)
                watcher = group.create_task(watch, name="start-up-watch")
                main.add_done_callback(lambda _: watcher.cancel())
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None
    return stats


async def _run(
    config: RunConfig,
    stats: RunStats,
    stop: asyncio.Event,
    on_ready: Callable[[RunStats], None] | None,
    metrics: Metrics | None,
) -> None:
    with startup.PausedCollector() as collector:
        await _start_and_run(config, stats, stop, on_ready, collector, metrics)


async def _start_and_run(
    config: RunConfig,
    stats: RunStats,
    stop: asyncio.Event,
    on_ready: Callable[[RunStats], None] | None,
    collector: startup.PausedCollector,
    metrics: Metrics | None,
) -> None:
    stats.startup_progress.enter(startup.LOADING)
    scenario = await startup.load_scenario_in_thread(config.scenario)
    _check_retention(config, hot_limit(scenario.memory))
    seed = scenario.scenario.seed if config.seed is None else config.seed
    run_id = config.run_id if config.run_id is not None else _default_run_id(scenario, seed)
    try:
        topics.run_root(run_id)
    except ValueError as exc:
        raise ConfigError(f"--run-id: {exc}") from exc
    index, count = parse_shard(config.shard)
    stats.run_id = run_id
    ticks = config.ticks if config.ticks is not None else scenario.scenario.ticks
    async with _workdir() as workdir, open_broker(config.broker, tls=config.broker_tls) as broker:
        stats.broker = f"{broker.kind} {broker.url}"
        stats.broker_address = broker.address
        run_key = run_key_for(config.run_key_file, broker)
        announce_trust(broker, run_id, run_key, workdir if config.remote_workers else None)
        bus_config = BusConfig(
            broker=broker.address, run=run_id, shard=str(index), protocol=broker.protocol, bounds=config.bounds,
            run_key=run_key,
        )
        pool_config = PoolConfig(
            backend=config.backend,
            options=dict(config.backend_options),
            concurrency=config.concurrency,
            max_in_flight=config.concurrency,
            timeout=config.inference_timeout,
            transport="mqtt" if config.remote_workers else "inprocess",
            broker=broker.address,
            run_key=run_key,
            run_id=run_id,
            shard=str(index),
        )
        db = Path(config.db) if config.db else workdir / f"{run_id}.shard{index}.db"
        async with (
            open_store(db, hot_limit=hot_limit(scenario.memory)) as store,
            open_bus(bus_config) as bus,
            open_pool(pool_config) as pool,
        ):
            _check_resume(config, db, store)
            stats.bus = bus.stats
            ctx = ShardContext(scenario, config, run_id, seed, bus, pool, store, stats, metrics)
            if metrics is not None:
                metrics.watch_pool(pool.statistics)
                metrics.watch_bus(bus.stats)
            await _run_shard(
                ctx, config, scenario, shard_npcs(scenario, index, count), index, ticks, stop, on_ready, collector
            )


async def _run_shard(
    ctx: ShardContext,
    config: RunConfig,
    scenario: Scenario,
    specs: list[NpcSpec],
    index: int,
    ticks: int,
    stop: asyncio.Event,
    on_ready: Callable[[RunStats], None] | None,
    collector: startup.PausedCollector,
) -> None:
    bus, stats = ctx.bus, ctx.stats
    store = ctx.store
    kinds: dict[str, Callable[[NpcSpec, ShardContext], Agent]] = {}
    for spec in specs:
        if spec.kind not in kinds:
            kind = AGENT_KINDS.get(spec.kind)
            if kind is None:
                raise ConfigError(f"npc {spec.id!r}: unknown kind {spec.kind!r}; known: {sorted(AGENT_KINDS)}")
            kinds[spec.kind] = _resolve(kind)
    progress = stats.startup_progress
    agents = await startup.create_agents(store, scenario, specs, progress, lambda spec: kinds[spec.kind](spec, ctx))
    stats.agents = len(agents)
    if ctx.metrics is not None:
        ctx.metrics.agents.set(len(agents))
    progress.enter(startup.SUBSCRIBING)
    await ctx.publish_roster(specs)
    by_location: dict[str, list[str]] = {}
    for spec in specs:
        by_location.setdefault(spec.location, []).append(spec.id)
    for location, ids in sorted(by_location.items()):
        await bus.listen_location(location, ids)
    await bus.listen_inboxes(sorted(by_location_ids := [s.id for s in specs]))
    local = set(by_location_ids)

    players: list[_Player] = []
    if index == 0:
        scripted = _resolve(PLAYER_KINDS["scripted"])
        players += [scripted(p, ctx.run_id) for p in scenario.players]
        bot = _resolve(PLAYER_KINDS["bot"])
        npc_ids = sorted(ctx.npc_ids)
        players += [bot(f"bot{i}", npc_ids, ctx.run_id, ctx.seed, config.bot_rate) for i in range(config.bots)]

    outside: list[tuple[str, PlayerInputMessage]] = []

    def on_player_input(player: str, message: PlayerInputMessage) -> None:
        if message.to not in local:
            if message.to not in ctx.npc_ids:
                bus.count_malformed(
                    "player input to an unknown NPC",
                    topics.player_input(ctx.run_id, player),
                    ValueError(f"no NPC {message.to!r} in this run"),
                )
            return
        outside.append((player, message))

    await bus.listen_player_input(on_player_input)
    world_updates: list[WorldStateMessage] = []
    await bus.listen_world_state(world_updates.append)

    first = 0 if not config.resume or store.last_tick is None else store.last_tick + 1
    stats.first_tick, stats.last_tick = first, first + ticks - 1
    if index == 0 and not config.resume and scenario.world:
        await bus.publish_world_state(WorldStateMessage(state={w.key: w.value for w in scenario.world}, tick=first))
    await bus.publish_status(StatusMessage(run=ctx.run_id, shard=ctx.shard, state="online", tick=first))

    wakes = {agent.id: asyncio.Event() for agent in agents}
    pending = 0
    all_done = asyncio.Event()
    current = [first]

    def finished() -> None:
        nonlocal pending
        pending -= 1
        if pending == 0:
            all_done.set()

    async def agent_loop(agent: Agent, wake: asyncio.Event) -> None:
        while True:
            await wake.wait()
            wake.clear()
            try:
                await agent.step(current[0])
            finally:
                finished()

    ext_seq = 0
    try:
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(agent_loop(a, wakes[a.id]), name=f"agent-{a.id}") for a in agents]
                collector.start_up_done()
                stats.startup_progress.enter(startup.RUNNING)
                if on_ready is not None:
                    on_ready(stats)
                try:
                    for tick in range(first, first + ticks):
                        if stop.is_set():
                            break
                        started = time.monotonic()
                        current[0] = tick
                        stats.tick = tick
                        taken_world, world_updates[:] = list(world_updates), []
                        for world in taken_world:
                            stats.world_changes += await _apply_world_state(store, sorted(local), world)
                        for player in players:
                            for event in player.inputs(tick):
                                _emit_player(ctx, player.location, event)
                                stats.player_inputs += 1
                        taken = limit_player_inputs(outside, config.bounds.player_inputs_per_tick, bus)
                        outside.clear()
                        for player_id, message in taken:
                            ext_seq += 1
                            event = Speech(
                                id=event_id(ctx.run_id, player_id, tick, 1_000_000 + ext_seq),
                                tick=tick,
                                speaker=player_id,
                                to=message.to,
                                text=message.text,
                                from_player=True,
                            )
                            bus.emit(topics.agent_inbox(ctx.run_id, message.to), event)
                            stats.player_inputs += 1
                        woken = [a for a in agents if a.wants_turn(tick)]
                        if woken:
                            pending = len(woken)
                            all_done.clear()
                            for agent in woken:
                                wakes[agent.id].set()
                            await all_done.wait()
                        await bus.flush(tick)
                        if ctx.metrics is not None:
                            ctx.metrics.awaited_shards.set(1)
                        try:
                            async with asyncio.timeout(config.echo_timeout):
                                await bus.wait_echoes()
                        except TimeoutError:
                            stats.late_echoes += bus.forget_echoes()
                            log.warning(
                                "tick %d: own batches did not come back within %.1f s", tick, config.echo_timeout
                            )
                        bus.report_overflow(tick)
                        await store.end_tick(tick)
                        if config.retain_memories is not None:
                            stats.memories_pruned += await store.prune_memories(config.retain_memories)
                        if ctx.metrics is not None:
                            ctx.metrics.awaited_shards.set(0)
                            ctx.metrics.tick_done(tick, time.monotonic() - started)
                        if tick % 10 == 0:
                            await bus.publish_status(
                                StatusMessage(run=ctx.run_id, shard=ctx.shard, state="online", tick=tick)
                            )
                        if config.tick_ms:
                            with contextlib.suppress(TimeoutError):
                                async with asyncio.timeout(
                                    max(0.0, config.tick_ms / 1000 - (time.monotonic() - started))
                                ):
                                    await stop.wait()
                finally:
                    for task in tasks:
                        task.cancel()
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None
    finally:
        await bus.publish_status(StatusMessage(run=ctx.run_id, shard=ctx.shard, state="offline", tick=stats.tick))


def _emit_player(ctx: ShardContext, location: str | None, event: Speech) -> None:
    """A player standing at the NPC's place is overheard there; otherwise it is a direct message."""
    if event.to is None:
        raise ValueError(f"player event {event.id!r} has no addressee")
    if location is not None and location == ctx.npc_location.get(event.to):
        ctx.bus.emit(ctx.location_topic(location), event)
    else:
        ctx.bus.emit(topics.agent_inbox(ctx.run_id, event.to), msgspec.structs.replace(event, location=None))
