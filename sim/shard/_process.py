"""One shard as a process: `run(config)` puts the broker and the signals around a shard (sim.shard._wiring).

In order: the scenario is parsed off the loop, the broker opened (or started), then the
store (its one writer: sim.store; without `record.db`, a new file in `record.runs_dir`,
whose oldest stores go once this one has started), which must belong to this run (sim.shard._instance);
the run key is read or made, bound to the run's nonce, and the trust announcements made;
then the bus and the pool. The Shard starts up, runs its ticks and says "offline" at the
end.

Shutdown (SIGINT/SIGTERM): the current tick stops where it is (between slices of its work)
and is not committed, the retained status says "offline", what is unsent gets half a
second, and the run returns normally; after the last tick, the same in order. A stop
during start-up cancels the start-up at once (sim.shard._startup). After a crash the
store rolls back the unfinished tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import msgspec

from sim.broker import BrokerInfo, open_broker
from sim.errors import ConfigError, single_error
from sim.inference import check_context_window, check_reply_room, open_tokenizer
from sim.metrics import MetricsSink, NullMetrics
from sim.protocol.seal import RunKey
from sim.shard._clock import Clock, SystemClock
from sim.shard._context import agent_kinds
from sim.shard._instance import claim_store, learn_run_nonce, run_claim, run_key_source
from sim.shard._layout import ShardLayout
from sim.shard._plan import ShardPlan
from sim.shard._run_config import (
    RecordConfig,
    RunConfig,
    check_resumable,
    check_resume,
    check_retention,
    check_shards,
    default_run_id,
    hot_limit,
    memory_config,
    parse_shard,
    with_servers,
)
from sim.shard._startup import (
    PausedCollector,
    StartupPhase,
    cancel_start_up_on,
    in_thread,
    load_scenario_in_thread,
)
from sim.shard._stats import RunStarted, RunStats
from sim.shard._trust import announce_trust, run_key_for
from sim.shard._wiring import Connection, Seams, open_shard
from sim.store import RunIdentity, Store, new_store, newest_store, prune_stores
from sim.wire import topics
from sim.wire.attempt import MAX_LINE_CHARS

__all__ = ["run"]

log = logging.getLogger(__name__)

_STOPPING_FLUSH = 0.5  # seconds a stopped run gives its unsent messages on the way out


async def run(
    config: RunConfig,
    *,
    stats: RunStats | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[RunStarted], None] | None = None,
    metrics: MetricsSink | None = None,
    clock: Clock | None = None,
) -> RunStats:
    """Run one shard to its last tick or until `stop` is set (SIGINT/SIGTERM set it too).

    A stop during start-up cancels the start-up at once (see sim.shard._startup); after it,
    the current tick ends first.
    """
    stats = stats or RunStats()
    stop = stop or asyncio.Event()
    clock = clock or SystemClock()
    stats.started = clock.now()
    index, _ = parse_shard(config.shard)
    stats.shard = str(index)
    with _signals(stop, stats):
        try:
            async with asyncio.TaskGroup() as group:
                main = group.create_task(_run(config, stats, stop, on_ready, metrics or NullMetrics(), clock),
                                         name="run")
                watch = cancel_start_up_on(stop, stats.startup_progress, main)
                watcher = group.create_task(watch, name="start-up-watch")
                main.add_done_callback(lambda _: watcher.cancel())
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None
    return stats


async def _run(
    config: RunConfig,
    stats: RunStats,
    stop: asyncio.Event,
    on_ready: Callable[[RunStarted], None] | None,
    metrics: MetricsSink,
    clock: Clock,
) -> None:
    with PausedCollector() as collector:
        stats.startup_progress.enter(StartupPhase.LOADING)
        scenario, text = await load_scenario_in_thread(config.scenario)
        scenario = msgspec.structs.replace(scenario, memory=memory_config(config, scenario))  # the run's overrides
        config = with_servers(config, scenario)
        check_retention(config, hot_limit(scenario.memory))
        check_shards(config, scenario)
        if config.inference.placement != "remote":  # remote workers bring their own servers
            await check_context_window(config.inference.backend, config.inference.backend_options,
                                       scenario.memory.max_context_tokens)
            check_reply_room(config.inference.backend, config.inference.backend_options,
                             (npc.policy() for npc in scenario.npcs), MAX_LINE_CHARS)
        seed = scenario.scenario.seed if config.seed is None else config.seed
        layout = await in_thread(lambda: ShardLayout(scenario, config.shard, seed), "npcsim-shard-layout")
        agent_kinds(layout.kinds)  # an unknown kind is refused before anything opens: no file is left behind
        run_id = config.run_id if config.run_id is not None else default_run_id(scenario, seed)
        try:
            topics.run_root(run_id)
        except ValueError as exc:
            raise ConfigError(f"--run-id: {exc}") from exc
        shard = str(parse_shard(config.shard)[0])
        stats.run_id = run_id
        kept = config.record.db is None and config.record.runs_dir is not None
        config = _kept_store(config, run_id)
        check_resumable(config)
        claim = run_claim(config, run_id=run_id, seed=seed, scenario=scenario, sha256=text.sha256)
        counting = open_tokenizer(scenario.memory, config.inference.backend, config.inference.backend_options)
        async with counting as tokenizer, _workdir() as workdir:
            db = Path(config.record.db) if config.record.db else workdir / f"{run_id}.shard{shard}.db"
            async with open_broker(config.broker.url, tls=config.broker.tls, ws_port=config.broker.ws_port) as broker:

                async def claim_run(store: Store) -> RunKey | None:
                    """The store belongs to this run: the run key is bound to its nonce, and announced."""
                    check_resume(config, db, store)
                    stats.broker = f"{broker.kind} {broker.url}"
                    run_key = await _bound_run_key(config, broker, store, claim, clock, text.data)
                    announce_trust(broker, run_id, run_key, workdir if config.inference.placement == "remote" else None)
                    return run_key

                plan = ShardPlan(config, scenario, run_id=run_id, seed=seed, layout=layout)
                async with open_shard(
                    plan, db, stats=stats, stop=stop, connection=Connection(broker.address, broker.protocol),
                    claim=claim_run, metrics=metrics, clock=clock, seams=Seams(tokenizer=tokenizer),
                ) as one:
                    await one.start()
                    if kept:
                        await in_thread(lambda: _prune(config.record), "npcsim-retention")
                    collector.start_up_done()
                    stats.startup_progress.enter(StartupPhase.RUNNING)
                    stats.running_since = clock.now()
                    if on_ready is not None:
                        on_ready(RunStarted(stats=stats, broker=broker, store=None if config.record.db is None else db))
                    if one.end <= one.first:
                        log.warning("nothing to run: the store is at tick %d and the run ends before tick %d",
                                    one.first, one.end)
                    try:
                        await one.run(until=one.end)
                    finally:
                        if stop.is_set():
                            one.ctx.bus.hurry(_STOPPING_FLUSH)
                        await one.go_offline()


def _kept_store(config: RunConfig, run_id: str) -> RunConfig:
    """The run with its store in `record.runs_dir` when it names no file of its own: a new
    file there (`RUN-ID.db`; shard i of n>1: `RUN-ID.shardI.db`), or with `--resume` the
    newest of this run and shard there."""
    record = config.record
    if record.db is not None or record.runs_dir is None:
        return config
    index, count = parse_shard(config.shard)
    directory = Path(record.runs_dir)
    if record.resume:
        db = newest_store(directory, run_id, f"{index}/{count}")
        if db is None:
            shard = "" if count == 1 else f", shard {index}/{count}"
            raise ConfigError(f"--resume: no store of run {run_id}{shard} in {directory}: give its --db")
    else:
        db = new_store(directory, run_id if count == 1 else f"{run_id}.shard{index}")
    return msgspec.structs.replace(config, record=msgspec.structs.replace(record, db=str(db)))


def _prune(record: RecordConfig) -> None:
    """Retention in the folder of kept stores: one log line naming what went."""
    assert record.runs_dir is not None
    deleted = prune_stores(Path(record.runs_dir), record.runs_kept)
    if deleted:
        log.warning("%s: deleted %s (record.runs_kept=%d: the newest stores stay)",
                    record.runs_dir, ", ".join(p.name for p in deleted), record.runs_kept)


async def _bound_run_key(
    config: RunConfig, broker: BrokerInfo, store: Store, claim: RunIdentity, clock: Clock, scenario: bytes
) -> RunKey | None:
    """The run key (sim.shard._trust), bound to the nonce of the run the store belongs to
    (sim.shard._instance: chosen by shard 0, learnt from it by the others); the store is sealed
    with it from its first write, and what it holds checked with it first."""
    db = config.record.db
    key = run_key_for(config.broker.run_key_file, broker, Path(db) if db else None)
    await store.seal_with(key, run_key_source(config))
    index, count = parse_shard(config.shard)

    async def learn() -> bytes:
        assert key is not None
        return await learn_run_nonce(broker.address, key, run_id=claim.run_id, shard=str(index), shards=count,
                                     clock=clock, protocol=broker.protocol)

    nonce = await claim_store(store, claim, config, None if index == 0 or key is None else learn, scenario)
    return None if key is None else key.for_run(nonce)


@contextlib.contextmanager
def _signals(stop: asyncio.Event, stats: RunStats) -> Iterator[None]:
    """SIGINT/SIGTERM ask for an orderly stop; the handlers are removed on exit."""
    loop = asyncio.get_running_loop()

    def handler(signum: int) -> None:
        log.warning("%s: stopping (an unfinished tick is not committed)", signal.Signals(signum).name)
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
