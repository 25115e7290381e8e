"""The Shard's tick logic and NpcAgent's decisions without Mosquitto and without real time.

An in-memory broker (tests/memory_broker.py) is the buses' transport: it delivers what the
shards publish in a seeded random order across topics (as a clustered broker may), and the
whole world runs on one virtual clock. The tick barrier must make the result the same for
one shard or three, whatever the order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from agents.npc import NpcAgent
from sim.bus import BusConfig, open_bus
from sim.errors import ConfigError
from sim.inference import PoolConfig, open_pool
from sim.mqtt import BrokerAddress
from sim.protocol.outside import RunWideArrival, WorldArrival
from sim.scenario import load_scenario, parse_scenario
from sim.shard import RunConfig, RunStats, Shard, ShardContext, ShardPlan, VirtualClock, ambient_roll
from sim.shard._dice import AmbientDice
from sim.shard._inputs import RunWideInputs
from sim.store import Writer, open_reader, open_store
from sim.wire import topics
from sim.wire.barrier import TickDone, decode_barrier
from sim.wire.events import Speech, decode_say
from sim.wire.inputs import GameFact, Presence
from tests.helpers import VILLAGE, SmallNpc, eventually, generated_world, npcsim_in_process, small_world
from tests.memory_broker import MemoryBroker
from tests.memory_shard import PacingClock, memory_shard, run_shards


async def run_in_memory(
    tmp_path: Path,
    scenario: str,
    shards: int,
    ticks: int,
    seed: int,
    counts: list[int] | None = None,
    during: Callable[[MemoryBroker, list[RunStats]], Awaitable[None]] | None = None,
) -> tuple[set, list, list[Path]]:
    """Run `shards` shards on the in-memory broker; the audit set and each shard's stats.

    `counts` gives each shard's idea of the shard count (default: all `shards`); `during`
    acts on the live run."""
    clock = PacingClock()
    broker = MemoryBroker(seed, clock)
    loaded = load_scenario(scenario)
    stats = [RunStats(shard=str(i)) for i in range(shards)]
    dbs = [tmp_path / f"mem-{shards}-{seed}-{i}.db" for i in range(shards)]
    counts = counts or [shards] * shards

    configs = [RunConfig(scenario=scenario, run_id="mem", ticks=ticks, shard=f"{i}/{counts[i]}", tick_ms=250)
               for i in range(shards)]
    await run_shards(broker, loaded, configs, dbs, stats, during(broker, stats) if during else None)
    records = set()
    for db in dbs:
        with open_reader(db) as reader:
            records |= {(r.id, r.prompt_sha256, r.line) for r in reader.audit_records()}
    # pacing sleeps for what is left of tick_ms (one per tick and shard at least: what arrives
    # wakes one early); virtual time passed them all, and a quiet world keeps the pace
    assert len(clock.sleeps) >= ticks * shards and all(s <= 0.25 for s in clock.sleeps)
    if during is None:
        assert clock.now() >= ticks * 0.25 and all(s.early_ticks == 0 for s in stats)
    return records, stats, dbs


async def test_one_or_three_shards_in_any_delivery_order_say_the_same(tmp_path: Path) -> None:
    one, _, _ = await run_in_memory(tmp_path, VILLAGE, 1, 30, seed=1)
    assert len(one) > 10
    for seed in (2, 3):
        three, stats, _ = await run_in_memory(tmp_path, VILLAGE, 3, 30, seed=seed)
        assert three == one, (sorted(one - three)[:3], sorted(three - one)[:3])
        assert all(s.tick == 29 and s.stalls == 0 for s in stats)


async def test_shards_started_with_different_counts_stop_with_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ExceptionGroup) as info:
        await run_in_memory(tmp_path, VILLAGE, 2, 5, seed=1, counts=[2, 3])
    errors = [str(e) for e in info.value.exceptions if isinstance(e, ConfigError)]
    assert errors[0] in {
        "--shard 0/2: shard 1 runs as 1/3, this one as 0/2: every shard of a run needs the same count",
        "--shard 1/3: shard 0 runs as 0/2, this one as 1/3: every shard of a run needs the same count",
    }


async def test_a_world_state_change_takes_effect_at_the_same_tick_on_every_shard(tmp_path: Path) -> None:
    async def crown(broker: MemoryBroker, stats: list[RunStats]) -> None:
        await eventually(lambda: stats[1].tick >= 6, what="shard 1 at tick 6", every=0.005)
        broker.accept(topics.world_state("mem"), b'{"state": {"king": "crowned: Queen Ysolde"}}')

    world = generated_world(tmp_path)
    _, stats, dbs = await run_in_memory(tmp_path, world, 3, 14, seed=4, during=crown)
    seen = []  # (tick, the king as that record's NPC knew him) for every inference on every shard
    for db in dbs:
        with open_reader(db) as reader:
            records = reader.audit_records()
            seen += [(r.tick, {w.key: w.value for w in r.state.world_state}.get("king")) for r in records]
    crowned = sorted({tick for tick, king in seen if king == "crowned: Queen Ysolde"})
    before = sorted({tick for tick, king in seen if king != "crowned: Queen Ysolde"})
    assert crowned and before and max(before) < min(crowned), (before, crowned)
    assert all(s.world_changes > 0 for s in stats)


# --- one tick, a held barrier, pacing: on virtual time ---------------------------------


def said(broker: MemoryBroker) -> list[tuple[str, str, int, str]]:
    return [(m.agent, m.to, m.tick, m.inference_id) for t, p in broker.published if t.endswith("/say")
            for m in [decode_say(p)]]


@contextlib.asynccontextmanager
async def village_shard(
    tmp_path: Path, clock: VirtualClock, *, shard: str = "0/1", tick_ms: int = 0, stop: asyncio.Event | None = None
) -> AsyncIterator[tuple[Shard, MemoryBroker]]:
    """A started village shard on the in-memory broker (broker served beside it)."""
    broker = MemoryBroker(1, clock)
    config = RunConfig(scenario=VILLAGE, run_id="mem", ticks=20, shard=shard, tick_ms=tick_ms)
    stats = RunStats(shard=shard.split("/")[0])
    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        async with memory_shard(broker, load_scenario(VILLAGE), config, tmp_path / "one.db", stats,
                                stop or asyncio.Event()) as one:
            await one.start()
            yield one, broker
        server.cancel()


async def test_step_runs_one_whole_tick(tmp_path: Path) -> None:
    """Tick 1: the player's scripted line goes out (one event on the square) and the tick is
    committed; tick 2: the snack machine, which perceived it, answers."""

    def tick_done(broker: MemoryBroker, tick: int) -> TickDone:
        sent = [decode_barrier(p) for t, p in broker.published if t == topics.barrier("mem", "0")]
        [done] = [m for m in sent if isinstance(m, TickDone) and m.tick == tick]
        return done

    async with village_shard(tmp_path, VirtualClock(autojump=0.005)) as (shard, broker):
        assert shard.next_tick == 0 and shard.store.last_tick is None
        assert await shard.step(0) is True
        assert (shard.next_tick, shard.stats.tick, shard.store.last_tick, shard.barrier.tick) == (1, 0, 0, 1)
        with pytest.raises(ValueError, match="the next tick is 1, not 5"):
            await shard.step(5)
        assert await shard.step(1) is True
        # the player's line on the square is delivered here, not published: one shard holds every place
        assert tick_done(broker, 1).batches == {}
        assert not [t for t, _ in broker.published if "/loc/" in t] and shard.bus.stats.events_local == 1
        assert shard.store.last_tick == 1 and shard.stats.player_inputs == 1 and said(broker) == []
        assert await shard.step(2) is True
        await shard.bus.wait_sent()
        assert ("snack_machine", "player", 2) in [(agent, to, tick) for agent, to, tick, _ in said(broker)]
        assert shard.store.last_tick == 2


async def test_a_held_barrier_logs_its_stall_after_echo_timeout_virtual_seconds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Shard 0 of two, alone: tick 0 waits for shard 1 forever. The stall is logged after 5
    virtual seconds (echo_timeout), which takes a fraction of a real second; a stop ends the wait."""
    clock, stop = VirtualClock(autojump=0.005), asyncio.Event()
    async with village_shard(tmp_path, clock, shard="0/2", stop=stop) as (shard, _):
        began, real = clock.now(), time.monotonic()
        with caplog.at_level(logging.WARNING, logger="sim.shard"):
            step = asyncio.ensure_future(shard.step(0))
            await eventually(lambda: shard.stats.stalls or step.done(), what="the stall or the end of the step",
                             within=5, every=0.005)
            assert shard.stats.stalls == 1 and not step.done()
            assert clock.now() - began >= 5.0
            assert time.monotonic() - real < 5.0
            stop.set()
            assert await step is False
        assert shard.store.last_tick is None  # not committed: it runs again on --resume
        assert shard.stats.awaiting == "shard 1"
        logged = [r.getMessage() for r in caplog.records]
        assert any(m.startswith("tick 0: waiting for shard 1 for 5.0 s") for m in logged)
        assert any("stopping while tick 0 waits for shard 1" in m for m in logged)


async def test_pacing_sleeps_are_virtual(tmp_path: Path) -> None:
    clock = PacingClock()
    async with village_shard(tmp_path, clock, tick_ms=1000) as (shard, _):
        began, real = clock.now(), time.monotonic()
        await shard.run(until=10)
        assert shard.next_tick == 10
        assert clock.now() - began >= 10.0  # ten ticks of a virtual second each
        assert time.monotonic() - real < 10.0
        assert len(clock.sleeps) >= 10 and all(s <= 1.0 for s in clock.sleeps) and shard.stats.early_ticks == 0


def test_the_shard_reads_time_only_from_its_clock() -> None:
    import sim.shard

    forbidden = ("time.time", "time.monotonic", "time.perf_counter", "asyncio.sleep(", "asyncio.timeout(")
    package = Path(sim.shard.__file__).parent
    found = {
        (path.name, word)
        for path in package.glob("*.py")
        for word in forbidden
        if word in path.read_text()
    }
    assert found and {name for name, _ in found} == {"_clock.py"}, found


def test_the_npc_reaches_the_engine_only_through_its_context() -> None:
    import ast

    import agents.npc

    source = Path(agents.npc.__file__).read_text()
    imported = {
        node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom) and node.module
    }
    engine = {m for m in imported if m.startswith("sim")}
    assert engine == {"sim.shard", "sim.memory", "sim.scenario", "sim.wire.events"}
    tree = ast.parse(source)
    [shard_import] = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "sim.shard"]
    assert [a.name for a in shard_import.names] == ["AgentContext"]
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not attributes & {"bus", "store", "pool", "outbox", "recorder", "emit", "publish"}


# --- NpcAgent, alone ----------------------------------------------------------------------

TWO = small_world("two", [SmallNpc("a"), SmallNpc("b", ambient_chance=0.5)], seed=4)


@contextlib.asynccontextmanager
async def agent_world(tmp_path: Path) -> AsyncIterator[tuple[ShardContext, MemoryBroker]]:
    """The two NPCs' shard context on a bus that goes nowhere: what they publish is recorded."""
    scenario = parse_scenario(TWO)
    broker = MemoryBroker(0, VirtualClock())
    bus_config = BusConfig(broker=BrokerAddress(), run="two", shard="0")
    async with (
        open_store(tmp_path / "two.db") as store,
        open_pool(PoolConfig()) as pool,
        open_bus(bus_config, transport=broker.transport()) as bus,
    ):
        for npc in scenario.npcs:
            await store.ensure_agent(scenario.initial_state(npc.id), writer=Writer.SCENARIO)
        config = RunConfig(scenario="two.toml", run_id="two")
        yield ShardContext(ShardPlan(config, scenario, run_id="two", seed=4), bus, pool, store, RunStats()), broker


async def test_an_npc_answers_what_came_before_its_tick_and_keeps_the_rest(tmp_path: Path) -> None:
    async with agent_world(tmp_path) as (ctx, broker):
        a = NpcAgent(ctx.scenario.npcs[0], ctx.agent_context(ctx.scenario.npcs[0]))
        box = ctx.bus.mail.mailbox("a")
        box.put(Speech(id="p:2", tick=2, speaker="visitor", to="a", text="Hello?", from_player=True))
        box.put(Speech(id="p:3", tick=3, speaker="visitor", to="a", text="Still there?", from_player=True))
        assert ctx.bus.mail.mail_holders(2) == [] and ctx.bus.mail.mail_holders(3) == ["a"]
        ctx.tick = 3
        await a.step(3, False)
        await ctx.bus.wait_sent()
        assert said(broker) == [("a", "visitor", 3, "two:a:3:2")]
        [batch] = ctx.outbox.flush(3)
        assert (batch.topic, batch.events) == ("npcsim/two/loc/square/events", 1)
        assert [e.id for e in box.drain()] == ["p:3"]
        assert [t for t, _ in broker.published if "/trace/" in t] == ["npcsim/two/trace/0"]


async def test_an_npc_whose_dice_fell_talks_to_a_neighbour(tmp_path: Path) -> None:
    async with agent_world(tmp_path) as (ctx, broker):
        dice = AmbientDice(4, ctx.scenario.npcs)
        turns = [t for t in range(200) if dice.roll(t)]
        assert turns == [t for t in range(200) if ambient_roll(4, "b", t) < 0.5]  # a's chance is 0: never
        assert 60 < len(turns) < 140
        b = NpcAgent(ctx.scenario.npcs[1], ctx.agent_context(ctx.scenario.npcs[1]))
        ctx.tick = turns[0]
        await b.step(turns[0], True)
        await ctx.bus.wait_sent()
        assert [to for _, to, _, _ in said(broker)] == ["a"]
        ctx.tick = turns[0] + 1
        await b.step(turns[0] + 1, False)  # no mail, no dice: nothing to say
        await ctx.bus.wait_sent()
        assert len(said(broker)) == 1


# --- the horizon ------------------------------------------------------------------------


def test_ticks_and_until_tick_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    ran = npcsim_in_process(capsys, "run", VILLAGE, "--ticks", "3", "--until-tick", "5", "--quiet")
    assert ran.code == 2
    assert ran.err.splitlines() == [
        "npcsim run: error: argument --until-tick: not allowed with argument --ticks"
    ]
    with pytest.raises(ConfigError, match="--ticks 3 and --until-tick 5: give one of them, not both"):
        RunConfig(scenario=VILLAGE, ticks=3, until_tick=5)


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_a_bad_until_tick_is_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    ran = npcsim_in_process(capsys, "run", VILLAGE, "--until-tick", value, "--quiet")
    assert ran.code == 2
    [line] = ran.err.splitlines()
    assert line.startswith("npcsim run: error: argument --until-tick: must be") and value in line
    with pytest.raises(ConfigError, match="--until-tick must be a whole number >= 1"):
        RunConfig(scenario=VILLAGE, until_tick=0)


def test_what_every_shard_applies_is_held_in_one_place_and_announced_once() -> None:
    """What arrived for a tick's TickDone is announced there, in the order it came, the later
    key winning; what the barrier made due is taken once, at the start of the next tick."""
    held = RunWideInputs()
    held.hold(WorldArrival(tick=3, state={"king": "dead", "weather": "rain"}))
    held.hold(WorldArrival(tick=2, state={"king": "alive"}))
    held.hold(RunWideArrival(tick=3, input=Presence(player="p", location="inn")))
    assert held.announce(2) == ({"king": "alive"}, ())
    held.hold(WorldArrival(tick=3, state={"weather": "snow"}))
    held.hold(RunWideArrival(tick=3, input=GameFact(npc=None, id="f", text="x")))
    assert held.announce(3) == ({"king": "dead", "weather": "snow"},
                                (Presence(player="p", location="inn"), GameFact(npc=None, id="f", text="x")))
    assert held.announce(4) == (None, ())
    held.world, held.inputs = {"weather": "fog"}, (Presence(player="p", location=None),)
    assert held.take_due() == ({"weather": "fog"}, (Presence(player="p", location=None),))
    assert held.take_due() == (None, ())
