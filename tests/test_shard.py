"""The Shard's tick logic and NpcAgent's decisions without a broker and without real time.

An in-memory broker stands in for Mosquitto: it delivers what the shards publish to every
bus whose filters match, in a seeded random order across topics (as a clustered broker
may), and the shards run on a virtual clock. The tick barrier must make the result the
same for one shard or three, whatever the order.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiomqtt
import pytest

from agents.npc import NpcAgent, ambient_roll
from sim.bus import Bus, BusConfig
from sim.cli import main
from sim.errors import ConfigError
from sim.generate import write_scenario
from sim.inference import PoolConfig, open_pool
from sim.mqtt import BrokerAddress
from sim.runner import RunConfig, RunStats, Shard, ShardContext, shard_npcs
from sim.scenario import load_scenario, parse_scenario
from sim.store import Writer, open_reader, open_store
from sim.wire import topics
from sim.wire.events import Speech
from tests.conftest import REPO

VILLAGE = str(REPO / "scenarios" / "village.toml")


class VirtualClock:
    """Time passes only when the shard sleeps; every sleep is recorded."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1.7e9 + self.t

    async def sleep(self, seconds: float, stop: asyncio.Event) -> None:
        self.sleeps.append(seconds)
        self.t += max(0.0, seconds)


class MemoryBroker:
    """Delivers each published message to every matching bus, in a seeded random order,
    each after a random delay of up to 20 ms (so a shard that did not wait for a batch
    would go on without it)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.buses: list[Bus] = []
        self.queue: list[tuple[str, bytes]] = []
        self.ready = asyncio.Event()

    def bus(self, run_id: str, shard: int) -> Bus:
        bus = Bus(BusConfig(broker=BrokerAddress(), run=run_id, shard=str(shard)))

        async def publish(topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
            self.queue.append((topic, payload))
            self.ready.set()

        bus.publish = publish  # type: ignore[method-assign]
        self.buses.append(bus)
        return bus

    async def serve(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.queue:
                topic, payload = self.queue.pop(self.rng.randrange(len(self.queue)))
                await asyncio.sleep(self.rng.random() * 0.02)
                for bus in self.buses:
                    if any(aiomqtt.Topic(topic).matches(f) for f in bus.filters):
                        bus.deliver(topic, payload)


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
    broker = MemoryBroker(seed)
    loaded = load_scenario(scenario)
    stats = [RunStats(shard=str(i)) for i in range(shards)]
    clocks = [VirtualClock() for _ in range(shards)]
    dbs = [tmp_path / f"mem-{shards}-{seed}-{i}.db" for i in range(shards)]
    counts = counts or [shards] * shards

    async def one(i: int) -> None:
        n = counts[i]
        config = RunConfig(scenario=scenario, run_id="mem", ticks=ticks, shard=f"{i}/{n}", tick_ms=250)
        async with open_store(dbs[i], keep_tail=False) as store, open_pool(PoolConfig()) as pool:
            bus = broker.bus("mem", i)
            ctx = ShardContext(loaded, config, "mem", loaded.scenario.seed, bus, pool, store, stats[i])
            shard = Shard(ctx, config, shard_npcs(loaded, i, n), i, n, asyncio.Event(), clocks[i])
            await shard.run()

    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        async with asyncio.timeout(120):
            await asyncio.gather(*(one(i) for i in range(shards)), *([during(broker, stats)] if during else []))
        server.cancel()
    records = set()
    for db in dbs:
        with open_reader(db) as reader:
            records |= {(r.id, r.prompt_sha256, r.line) for r in reader.audit_records()}
    for clock in clocks:
        assert len(clock.sleeps) == ticks and all(s == pytest.approx(0.25) for s in clock.sleeps)
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
        for _ in range(5000):
            if stats[1].tick >= 6:
                break
            await asyncio.sleep(0.005)
        broker.queue.append((topics.world_state("mem"), b'{"state": {"king": "crowned: Queen Ysolde"}}'))
        broker.ready.set()

    world = str(write_scenario(tmp_path / "generated.toml", npcs=200, locations=12, seed=5))
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


# --- NpcAgent, alone ----------------------------------------------------------------------

TWO = """
[scenario]
name = "two"
seed = 4
[[locations]]
id = "square"
[[npcs]]
id = "a"
name = "A"
location = "square"
system_prompt = "You are A."
ambient_chance = 0.0
[[npcs]]
id = "b"
name = "B"
location = "square"
system_prompt = "You are B."
ambient_chance = 0.5
"""


class RecordingBus:
    """What an agent uses of the bus: its mailbox, and what it emits and says, recorded."""

    def __init__(self) -> None:
        self.bus = Bus(BusConfig(broker=BrokerAddress(), run="two", shard="0"))
        self.emitted: list[tuple[str, Speech]] = []
        self.said: list[object] = []
        self.published: list[str] = []  # the trace of each inference

    def mailbox(self, agent: str):  # type: ignore[no-untyped-def]
        return self.bus.mailbox(agent)

    def emit(self, topic: str, event: Speech) -> None:
        self.emitted.append((topic, event))

    async def publish_say(self, message: object) -> None:
        self.said.append(message)

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        self.published.append(topic)


@contextlib.asynccontextmanager
async def agent_world(tmp_path: Path) -> AsyncIterator[tuple[ShardContext, RecordingBus]]:
    scenario = parse_scenario(TWO)
    bus = RecordingBus()
    async with open_store(tmp_path / "two.db") as store, open_pool(PoolConfig()) as pool:
        for npc in scenario.npcs:
            await store.ensure_agent(scenario.initial_state(npc.id), writer=Writer.SCENARIO)
        config = RunConfig(scenario="two.toml", run_id="two")
        ctx = ShardContext(scenario, config, "two", 4, bus, pool, store, RunStats())  # type: ignore[arg-type]
        yield ctx, bus


async def test_an_npc_answers_what_came_before_its_tick_and_keeps_the_rest(tmp_path: Path) -> None:
    async with agent_world(tmp_path) as (ctx, bus):
        a = NpcAgent(ctx.scenario.npcs[0], ctx)
        box = bus.mailbox("a")
        box.put(Speech(id="p:2", tick=2, speaker="visitor", to="a", text="Hello?", from_player=True))
        box.put(Speech(id="p:3", tick=3, speaker="visitor", to="a", text="Still there?", from_player=True))
        assert not a.wants_turn(2)
        assert a.wants_turn(3)
        await a.step(3)
        assert [(m.to, m.tick, m.inference_id) for m in bus.said] == [("visitor", 3, "two:a:3:2")]  # type: ignore[attr-defined]
        assert [(t, e.id, e.turn) for t, e in bus.emitted] == [("npcsim/two/loc/square/events", "two:a:3:2", 1)]
        assert [e.id for e in box.drain()] == ["p:3"]
        assert bus.published == ["npcsim/two/trace/0"]


async def test_ambient_dice_are_a_function_of_seed_id_and_tick(tmp_path: Path) -> None:
    async with agent_world(tmp_path) as (ctx, bus):
        b = NpcAgent(ctx.scenario.npcs[1], ctx)
        turns = [t for t in range(200) if b.wants_turn(t)]
        assert turns == [t for t in range(200) if ambient_roll(4, "b", t) < 0.5]
        assert 60 < len(turns) < 140
        assert b.wants_turn(turns[0])  # the runner asks, then steps, each tick
        await b.step(turns[0])
        assert [m.to for m in bus.said] == ["a"]  # type: ignore[attr-defined]


# --- the horizon ------------------------------------------------------------------------


def test_ticks_and_until_tick_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", VILLAGE, "--ticks", "3", "--until-tick", "5", "--quiet"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "npcsim run: error: argument --until-tick: not allowed with argument --ticks"
    ]
    with pytest.raises(ConfigError, match="--ticks 3 and --until-tick 5: give one of them, not both"):
        RunConfig(scenario=VILLAGE, ticks=3, until_tick=5)


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_a_bad_until_tick_is_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", VILLAGE, "--until-tick", value, "--quiet"])
    assert exit_info.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("npcsim run: error: argument --until-tick: must be") and value in line
    with pytest.raises(ConfigError, match="--until-tick must be a whole number >= 1"):
        RunConfig(scenario=VILLAGE, until_tick=0)
