"""A shard: scenario + store + bus + inference pool + agents, and its tick loop (`Shard`).

The tick is the clock, and a barrier for the whole run (sim.protocol.barrier). Each tick, in
`Shard`'s methods:
1. `take_inputs`: the world-state changes shard 0 took in the previous tick (announced in
   its TickDone, so every shard applies them at the same tick), scripted and bot players
   (functions of seed and tick) and outside clients' JSON (stamped with this tick and
   stored) become events;
2. `step_agents`: the local agents that have mail from earlier ticks or roll to talk
   take their turn, concurrently, and the tick waits for all of them;
3. `publish`: the tick's events go out as one msgpack batch per topic, then the shard's
   TickDone listing them; everything sent is kept for re-sending;
4. `wait_barrier`: until every shard finished the tick and every batch of it routed here
   arrived; a stall is logged and shown on the status topic, never skipped;
5. `commit`: the store commits the tick with what was sent in it, atomically.

Resume (`--resume`) starts by passing the barrier of the last committed tick again: the
shard re-sends what it sent in that tick (from the store) and asks the others for theirs
(Join), so the events not yet perceived at the crash are in the mailboxes again.

Shutdown (SIGINT/SIGTERM, or the last tick): no new tick starts, the current one
finishes, the retained status says "offline", and the run returns normally. After a crash
the store rolls back the unfinished tick.

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
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from sim import startup
from sim.audit import AuditRecord, make_record
from sim.broker import open_broker
from sim.bus import Bus, BusConfig, open_bus
from sim.errors import ConfigError, single_error
from sim.inference import InferenceRequest, InferenceResult, Pool, PoolConfig, Priority, open_pool
from sim.memory import Belief, Episode, Line, NpcState, WorkingMemory, WorkingMemoryConfig, WorldFact
from sim.metrics import Metrics
from sim.mqtt import BrokerAddress, TlsFiles
from sim.protocol.barrier import Barrier
from sim.protocol.bounds import InputBounds
from sim.scenario import NpcSpec, Scenario
from sim.store import HOT_LIMIT, Store, Writer, open_store
from sim.trust import announce_trust, limit_player_inputs, run_key_for
from sim.wire import topics
from sim.wire.barrier import BarrierMessage, Join
from sim.wire.events import PlayerInputMessage, SayMessage, Speech, StatusMessage, WorldStateMessage, event_id
from sim.wire.trace import RosterEntry, RosterMessage, encode_roster, encode_trace, trace_of

__all__ = [
    "AGENT_KINDS",
    "Agent",
    "Clock",
    "RunConfig",
    "RunStats",
    "Shard",
    "ShardContext",
    "SystemClock",
    "hot_limit",
    "parse_shard",
    "run",
    "shard_npcs",
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
    until_tick: int | None = None  # run up to and including tick until_tick - 1 (not with `ticks`)
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
    echo_timeout: float = 5.0  # a barrier held longer than this is logged as a stall
    shutdown_timeout: float = 10.0
    inference_timeout: float = 30.0
    keep_dialogue: bool = False
    trace_prompts: bool = True  # the trace topic carries each prompt (off: report and digest only)
    retain_memories: int | None = None  # prune memories past each agent's newest N per category; None keeps all

    def __post_init__(self) -> None:
        """The library's boundary: the same values the CLI refuses are refused here, by option name."""
        minimum = {"ticks": 1, "until_tick": 1, "tick_ms": 0, "concurrency": 1, "bots": 0, "retain_memories": 1}
        for name, low in minimum.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"--{name.replace('_', '-')} must be a whole number >= {low}, got {value!r}")
        for name in ("inference_timeout", "echo_timeout", "shutdown_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise ConfigError(f"--{name.replace('_', '-')} must be a number of seconds > 0, got {value!r}")
        if self.ticks is not None and self.until_tick is not None:
            raise ConfigError(f"--ticks {self.ticks} and --until-tick {self.until_tick}: give one of them, not both")


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
    stalls: int = 0
    barrier_seconds: float = 0.0  # time spent waiting at the barrier, after the first tick run
    barrier_ticks: int = 0
    awaiting: str = ""
    awaiting_since: float | None = None
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


class Clock(Protocol):
    """What the tick loop reads time from; tests inject a virtual one."""

    def now(self) -> float:
        """Monotonic seconds (durations, pacing)."""
        ...

    def wall(self) -> float:
        """Unix time (what the status topic says)."""
        ...

    async def sleep(self, seconds: float, stop: asyncio.Event) -> None:
        """Wait `seconds` or until `stop` is set."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float, stop: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await stop.wait()


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
    clock: Clock | None = None,
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
                job = _run(config, stats, stop, on_ready, metrics, clock or SystemClock())
                main = group.create_task(job, name="run")
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
    clock: Clock,
) -> None:
    with startup.PausedCollector() as collector:
        await _start_and_run(config, stats, stop, on_ready, collector, metrics, clock)


async def _start_and_run(
    config: RunConfig,
    stats: RunStats,
    stop: asyncio.Event,
    on_ready: Callable[[RunStats], None] | None,
    collector: startup.PausedCollector,
    metrics: Metrics | None,
    clock: Clock,
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
            open_store(db, hot_limit=hot_limit(scenario.memory), keep_tail=False) as store,
            open_bus(bus_config) as bus,
            open_pool(pool_config) as pool,
        ):
            _check_resume(config, db, store)
            stats.bus = bus.stats
            ctx = ShardContext(scenario, config, run_id, seed, bus, pool, store, stats, metrics)
            if metrics is not None:
                metrics.watch_pool(pool.statistics)
                metrics.watch_bus(bus.stats)
            specs = shard_npcs(scenario, index, count)
            await Shard(ctx, config, specs, index, count, stop, clock).run(on_ready, collector)



class Shard:
    """One shard's tick loop: each phase of a tick is a method (see the module's docstring)."""

    def __init__(
        self,
        ctx: ShardContext,
        config: RunConfig,
        specs: Sequence[NpcSpec],
        index: int,
        count: int,
        stop: asyncio.Event,
        clock: Clock,
    ) -> None:
        self.ctx, self.config, self.specs, self.stop, self.clock = ctx, config, list(specs), stop, clock
        self.bus, self.store, self.stats = ctx.bus, ctx.store, ctx.stats
        self.index = index
        self.local = frozenset(spec.id for spec in specs)
        self.agents: list[Agent] = []
        self.players: list[_Player] = []
        self.outside: list[tuple[str, PlayerInputMessage]] = []
        self.world_updates: list[WorldStateMessage] = []  # shard 0: taken into its next TickDone
        self.world_due: dict[str, str] | None = None  # applied at the start of the next tick
        last = self.store.last_tick if config.resume else None
        self.first = 0 if last is None else last + 1
        self.end = config.until_tick if config.until_tick is not None else self.first + (
            config.ticks if config.ticks is not None else ctx.scenario.scenario.ticks
        )
        self.barrier = Barrier(
            str(index), [str(i) for i in range(count)], self.bus.router.is_routed, tick=self.first
        )
        self._resend_since: int | None = None

    # --- setting up ----------------------------------------------------------------------

    async def setup(self) -> None:
        """Load or create the agents, listen to their topics, join the run's barrier."""
        ctx, bus, store = self.ctx, self.bus, self.store
        await self._restore_sent()
        bus.router.stale_before = self.barrier.tick
        await bus.listen_barrier(self._on_batch, self._on_barrier)  # first: every batch is counted
        kinds: dict[str, Callable[[NpcSpec, ShardContext], Agent]] = {}
        for spec in self.specs:
            if spec.kind not in kinds:
                kind = AGENT_KINDS.get(spec.kind)
                if kind is None:
                    raise ConfigError(f"npc {spec.id!r}: unknown kind {spec.kind!r}; known: {sorted(AGENT_KINDS)}")
                kinds[spec.kind] = _resolve(kind)
        progress = self.stats.startup_progress
        self.agents = await startup.create_agents(
            store, ctx.scenario, self.specs, progress, lambda spec: kinds[spec.kind](spec, ctx)
        )
        self.stats.agents = len(self.agents)
        if ctx.metrics is not None:
            ctx.metrics.agents.set(len(self.agents))
        progress.enter(startup.SUBSCRIBING)
        await ctx.publish_roster(self.specs)
        by_location: dict[str, list[str]] = {}
        for spec in self.specs:
            by_location.setdefault(spec.location, []).append(spec.id)
        for location, ids in sorted(by_location.items()):
            await bus.listen_location(location, ids)
        await bus.listen_inboxes(sorted(self.local))
        if self.index == 0:
            self.players = self._players()
        await bus.listen_player_input(self._on_player_input)
        if self.index == 0:
            await bus.listen_world_state(self.world_updates.append)
        bus.on_connected = self._rejoin
        await self._rejoin()

    def _players(self) -> list[_Player]:
        ctx, config = self.ctx, self.config
        scripted = _resolve(PLAYER_KINDS["scripted"])
        players: list[_Player] = [scripted(p, ctx.run_id) for p in ctx.scenario.players]
        bot = _resolve(PLAYER_KINDS["bot"])
        npc_ids = sorted(ctx.npc_ids)
        players += [bot(f"bot{i}", npc_ids, ctx.run_id, ctx.seed, config.bot_rate) for i in range(config.bots)]
        return players

    async def _restore_sent(self) -> None:
        """On resume: keep again what the last two committed ticks sent, and pass the last
        one's barrier again (the others re-send theirs: docs/topics.md, "The tick barrier")."""
        last = self.first - 1
        if last < 0:
            return
        sent = await self.store.sent()
        if not any(tick == last for tick, _, _ in sent):
            log.warning("%s: no record of what tick %d sent; its events are not perceived again", self.store.path, last)
            return
        self.barrier = Barrier(self.barrier.shard, self.barrier.shards, self.bus.router.is_routed, tick=last)
        for tick, topic, payload in sent:
            self.barrier.keep(tick, topic, payload)

    def _on_player_input(self, player: str, message: PlayerInputMessage) -> None:
        if message.to not in self.local:
            if message.to not in self.ctx.npc_ids:
                self.bus.count_malformed(
                    "player input to an unknown NPC",
                    topics.player_input(self.ctx.run_id, player),
                    ValueError(f"no NPC {message.to!r} in this run"),
                )
            return
        self.outside.append((player, message))

    def _on_batch(self, shard: str, tick: int, topic: str, events: int) -> None:
        self.barrier.batch_received(shard, tick, topic, events)

    def _on_barrier(self, message: BarrierMessage) -> None:
        if isinstance(message, Join):
            if message.shard != self.barrier.shard and self.barrier.same_run(message):
                since = message.tick if self._resend_since is None else min(self._resend_since, message.tick)
                self._resend_since = since
            return
        self.barrier.done_received(message)

    async def _rejoin(self) -> None:
        """After (re)connecting: re-send everything kept, then ask the others for theirs."""
        for topic, payload in self.barrier.kept(0):
            await self.bus.publish(topic, payload)
        await self.bus.publish_barrier(self.barrier.join())

    async def _serve_resends(self) -> None:
        since, self._resend_since = self._resend_since, None
        if since is not None:
            for topic, payload in self.barrier.kept(since):
                await self.bus.publish(topic, payload)

    # --- the tick --------------------------------------------------------------------------

    async def run(
        self, on_ready: Callable[[RunStats], None] | None = None, collector: startup.PausedCollector | None = None
    ) -> None:
        ctx, bus, stats = self.ctx, self.bus, self.stats
        await self.setup()
        stats.first_tick, stats.last_tick, stats.tick = self.first, self.end - 1, self.first - 1
        if self.index == 0 and not self.config.resume and ctx.scenario.world:
            world = WorldStateMessage(state={w.key: w.value for w in ctx.scenario.world}, tick=self.first)
            await bus.publish_world_state(world)
        await self._status()
        if collector is not None:
            collector.start_up_done()
        stats.startup_progress.enter(startup.RUNNING)
        if on_ready is not None:
            on_ready(stats)
        if self.end <= self.first:
            log.warning("nothing to run: the store is at tick %d and the run ends before tick %d", self.first, self.end)
        try:
            if self.barrier.tick < self.first < self.end and not await self.wait_barrier(self.barrier.tick):
                return
            for tick in range(self.first, self.end):
                if self.stop.is_set():
                    break
                started = self.clock.now()
                stats.tick = tick
                await self.take_inputs(tick)
                await self.step_agents(tick)
                await self.publish(tick)
                if not await self.wait_barrier(tick):
                    break
                await self.commit(tick)
                if ctx.metrics is not None:
                    ctx.metrics.tick_done(tick, self.clock.now() - started)
                if self.config.tick_ms:
                    await self.clock.sleep(self.config.tick_ms / 1000 - (self.clock.now() - started), self.stop)
        finally:
            await self._status("offline")

    async def take_inputs(self, tick: int) -> None:
        """World-state changes, then the players' inputs of this tick, as events."""
        ctx, stats = self.ctx, self.stats
        if self.world_due:
            world = WorldStateMessage(state=self.world_due, tick=tick)
            stats.world_changes += await _apply_world_state(self.store, sorted(self.local), world)
        self.world_due = None
        for player in self.players:
            for event in player.inputs(tick):
                _emit_player(ctx, player.location, event)
                stats.player_inputs += 1
        taken = limit_player_inputs(self.outside, self.config.bounds.player_inputs_per_tick, self.bus)
        self.outside.clear()
        for seq, (player_id, message) in enumerate(taken):
            await self.store.record_input(tick, seq, player_id, message.to, message.text)
            event = Speech(
                id=event_id(ctx.run_id, player_id, tick, 1_000_000 + seq),
                tick=tick,
                speaker=player_id,
                to=message.to,
                text=message.text,
                from_player=True,
            )
            self.bus.emit(topics.agent_inbox(ctx.run_id, message.to), event)
            stats.player_inputs += 1

    async def step_agents(self, tick: int) -> None:
        """Every agent with mail from earlier ticks, or that rolls to talk, takes its turn."""
        woken = [agent for agent in self.agents if agent.wants_turn(tick)]
        try:
            async with asyncio.TaskGroup() as group:
                for agent in woken:
                    group.create_task(agent.step(tick), name=f"agent-{agent.id}")
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None

    async def publish(self, tick: int) -> None:
        """The tick's batches, then the TickDone that lists them; all kept for re-sending."""
        for topic, payload, events in await self.bus.flush(tick):
            self.barrier.keep(tick, topic, payload, events=events)
        world: dict[str, str] = {}
        for message in self.world_updates:  # shard 0 only: in the order they arrived
            world.update(message.state)
        self.world_updates.clear()
        topic, payload = await self.bus.publish_barrier(self.barrier.finish(tick, world or None))
        self.barrier.keep(tick, topic, payload)

    async def wait_barrier(self, tick: int) -> bool:
        """Until the barrier for `tick` passes; serve re-send requests; say who holds it up.

        False when asked to stop while held: the tick is not committed (the store rolls it
        back) and runs again on --resume.
        """
        started, since = self.clock.now(), self.clock.wall()
        announced = ""
        warned = False
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_BARRIER_POLL):
                    await self.bus.wait_for(lambda: self.barrier.passed(tick) or self._resend_since is not None)
            await self._serve_resends()
            if self.barrier.conflict is not None:
                raise ConfigError(f"--shard {self.config.shard}: {self.barrier.conflict}")
            if self.barrier.passed(tick):
                self.world_due = self.barrier.world(tick)
                break
            if self.stop.is_set():
                held = ", ".join(self.barrier.awaited(tick))
                log.warning("stopping while tick %d waits for %s: it runs again on --resume", tick, held)
                return False
            waited = self.clock.now() - started
            if waited < _BARRIER_POLL:
                continue
            awaited = self.barrier.awaited(tick)
            awaiting = ", ".join(awaited)
            if self.ctx.metrics is not None:
                self.ctx.metrics.awaited_shards.set(len(awaited))
            if awaiting != announced:
                announced = awaiting
                self.stats.awaiting, self.stats.awaiting_since = awaiting, started
                await self._status(awaiting=awaiting, since=since)
            if waited >= self.config.echo_timeout and not warned:
                warned = True
                self.stats.stalls += 1
                log.warning("tick %d: waiting for %s for %.1f s; the run holds until then", tick, awaiting, waited)
        self.barrier.advance(tick)
        self.bus.router.stale_before = self.barrier.tick
        if self.ctx.metrics is not None:
            self.ctx.metrics.awaited_shards.set(0)
        if tick > self.first:  # the first tick also waits for the other shards to start
            self.stats.barrier_seconds += self.clock.now() - started
            self.stats.barrier_ticks += 1
        if announced:
            self.stats.awaiting, self.stats.awaiting_since = "", None
            await self._status()
        return True

    async def commit(self, tick: int) -> None:
        """The tick and what it sent, in one transaction; status every 10 ticks."""
        self.bus.report_overflow(tick)
        await self.store.keep_sent(self.barrier.kept_by_tick())
        await self.store.end_tick(tick)
        if self.config.retain_memories is not None:
            self.stats.memories_pruned += await self.store.prune_memories(self.config.retain_memories)
        if tick % 10 == 0:
            await self._status()

    async def _status(self, state: str = "online", *, awaiting: str | None = None, since: float | None = None) -> None:
        tick = self.stats.tick if self.stats.tick >= 0 else self.first
        message = StatusMessage(
            run=self.ctx.run_id, shard=self.ctx.shard, state=state, tick=tick, awaiting=awaiting, since=since
        )
        await self.bus.publish_status(message)


_BARRIER_POLL = 0.5  # seconds between looks at a held barrier (status, stall warning)


def _emit_player(ctx: ShardContext, location: str | None, event: Speech) -> None:
    """A player standing at the NPC's place is overheard there; otherwise it is a direct message."""
    if event.to is None:
        raise ValueError(f"player event {event.id!r} has no addressee")
    if location is not None and location == ctx.npc_location.get(event.to):
        ctx.bus.emit(ctx.location_topic(location), event)
    else:
        ctx.bus.emit(topics.agent_inbox(ctx.run_id, event.to), msgspec.structs.replace(event, location=None))
