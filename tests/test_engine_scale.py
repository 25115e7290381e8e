"""The engine at scale, by counts (never timings): what a tick costs follows what is said.

On the in-memory broker and a virtual clock (tests/memory_broker.py): a tick's store and
broker calls do not grow with the number of NPCs who overhear a line; an NPC with no mail
and whose dice did not fall is never stepped; the shard's dice are the NPCs' `ambient_roll`;
a shard publishes no batch for its own places and waits for no echo of them.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents.npc import NpcAgent
from sim.scenario import NpcSpec, load_scenario, parse_scenario
from sim.shard import AGENT_KINDS, AgentContext, RunConfig, RunStats, ambient_roll
from sim.shard._dice import AmbientDice
from sim.store import Resume, Store
from sim.wire import topics
from sim.wire.barrier import TickDone, decode_barrier
from sim.wire.events import decode_say
from tests.helpers import VILLAGE
from tests.memory_broker import MemoryBroker
from tests.memory_shard import PacingClock, memory_shard

STEPS: list[tuple[str, int, bool]] = []  # (npc, tick, ambient) of every turn taken


class CountingNpc(NpcAgent):
    """An NPC that notes every turn it is given."""

    __slots__ = ()

    def __init__(self, spec: NpcSpec, ctx: AgentContext) -> None:
        super().__init__(spec, ctx)

    async def step(self, tick: int, ambient: bool) -> None:
        STEPS.append((self.id, tick, ambient))
        await super().step(tick, ambient)


@pytest.fixture(autouse=True)
def counting_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(AGENT_KINDS, "counting", f"{__name__}:CountingNpc")
    STEPS.clear()


def square(npcs: int, chances: Callable[[int], float], *, lines: dict[int, str]) -> str:
    """`npcs` NPCs of the counting kind on one square; a scripted player there speaks to n0."""
    out = ['[scenario]\nname = "square"\nseed = 3\n\n[[locations]]\nid = "square"\n\n[[locations]]\nid = "lane"']
    for i in range(npcs):
        out.append(f'[[npcs]]\nid = "n{i}"\nname = "N{i}"\nlocation = "{"square" if i % 5 else "lane"}"\n'
                   f'kind = "counting"\nsystem_prompt = "You are N{i}."\nambient_chance = {chances(i)}')
    script = ", ".join(f'{{ tick = {t}, to = "n1", text = "{text}" }}' for t, text in sorted(lines.items()))
    out.append(f'[[players]]\nid = "visitor"\nlocation = "square"\nscript = [ {script} ]')
    return "\n\n".join(out) + "\n"


async def run_square(tmp_path: Path, text: str, ticks: int, name: str,
                     counted: Callable[[MemoryBroker], object] | None = None) -> tuple[MemoryBroker, RunStats]:
    """Run the scenario on one shard; `counted(broker)` is called once start-up is over."""
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    clock = PacingClock()
    broker = MemoryBroker(1, clock)
    config = RunConfig(scenario=str(path), run_id="mem", ticks=ticks)
    stats = RunStats()
    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        async with memory_shard(broker, load_scenario(path), config, tmp_path / f"{name}.db", stats,
                                asyncio.Event()) as shard:
            await shard.start()
            await shard.bus.wait_sent()
            if counted is not None:
                counted(broker)
            await shard.run(until=shard.end)
            await shard.bus.wait_sent()
        server.cancel()
    return broker, stats


async def test_a_ticks_store_and_broker_calls_do_not_grow_with_the_listeners_of_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: collections.Counter[str] = collections.Counter()
    store_calls = ("add_fact", "set_world", "add_episode", "add_belief", "add_line", "record", "add_place_events",
                   "commit_tick", "end_tick", "ensure_agents", "load_agents")
    for owner, name in [*((Store, n) for n in store_calls), (Resume, "record_input"), (Resume, "keep")]:
        real = getattr(owner, name)

        def counting(real: Any = real, name: str = name) -> Any:
            async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return await real(self, *args, **kwargs)
            return call

        monkeypatch.setattr(owner, name, counting())
    lines = {1: "Hello there.", 2: "Any news?", 4: "Farewell."}
    seen = []
    started: list[int] = []  # what the broker had been sent when each run's start-up was over

    def count_from_here(broker: MemoryBroker) -> None:
        calls.clear()
        started.append(len(broker.published))

    for npcs in (10, 1_000):
        broker, stats = await run_square(tmp_path, square(npcs, lambda i: 0.0, lines=lines), 7, f"sq{npcs}",
                                         counted=count_from_here)
        said = [decode_say(p) for t, p in broker.published if t.endswith("/say")]
        seen.append((dict(calls), len(broker.published) - started[-1], len(said), stats.bus.events_delivered))
    (calls_10, sent_10, said_10, heard_10), (calls_1000, sent_1000, said_1000, heard_1000) = seen
    assert said_10 == said_1000 == len(lines)  # n1 answers each line, nobody else says a thing
    assert calls_10 == calls_1000 and sent_10 == sent_1000, (calls_10, calls_1000, sent_10, sent_1000)
    # one row per place and tick with events: the player's lines, n1's answers a tick later
    assert calls_10["add_place_events"] == len({*lines, *(tick + 1 for tick in lines)})
    assert heard_1000 > 50 * heard_10  # ...while as many more NPCs heard every line


async def test_an_npc_with_no_mail_and_no_dice_is_never_stepped(tmp_path: Path) -> None:
    chances = lambda i: 0.3 if i % 4 == 0 else 0.0  # noqa: E731 - the scenario's dice, named once
    broker, _ = await run_square(tmp_path, square(40, chances, lines={2: "Over here!"}), 12, "idle")
    spoken_to: dict[int, set[str]] = collections.defaultdict(set)  # tick -> NPCs said something to then
    for t, p in broker.published:
        if t.endswith("/say"):
            say = decode_say(p)
            spoken_to[say.tick].add(say.to or "")
    spoken_to[2].add("n1")
    by_tick: dict[int, set[str]] = collections.defaultdict(set)
    for npc, tick, ambient in STEPS:
        by_tick[tick].add(npc)
        assert ambient == (ambient_roll(3, npc, tick) < chances(int(npc[1:])))
    for tick in range(12):
        fell = {f"n{i}" for i in range(40) if ambient_roll(3, f"n{i}", tick) < chances(i)}
        assert by_tick[tick] == fell | (spoken_to[tick - 1] & {f"n{i}" for i in range(40)}), tick
    assert len(STEPS) == len(set(STEPS))  # one turn per NPC and tick
    never = {f"n{i}" for i in range(40) if chances(i) == 0} - set().union(*spoken_to.values())
    assert never and not never & {npc for npc, _, _ in STEPS}


def test_the_shards_dice_are_every_npcs_ambient_roll() -> None:
    text = "\n\n".join(
        ['[scenario]\nname = "dice"\nseed = 11\n\n[[locations]]\nid = "x"']
        + [f'[[npcs]]\nid = "m{i}"\nname = "M"\nlocation = "x"\nsystem_prompt = "M."\n'
           f'ambient_chance = {(0.0, 0.01, 0.3, 0.999, 1.0)[i % 5]}' for i in range(300)]
    )
    specs = parse_scenario(text).npcs
    dice = AmbientDice(11, specs)
    assert len(dice) == 240  # the chances of 0 are not rolled
    for tick in range(0, 400, 9):
        expected = [s.id for s in specs if ambient_roll(11, s.id, tick) < s.ambient_chance]
        assert dice.roll(tick) == expected
        assert dice.roll(tick, 0, 100) + dice.roll(tick, 100, 1000) == expected  # in slices, the same


async def test_one_shard_publishes_no_batch_and_waits_for_no_echo(tmp_path: Path) -> None:
    clock = PacingClock()
    broker = MemoryBroker(1, clock)
    config = RunConfig(scenario=VILLAGE, run_id="mem", ticks=25)
    stats = RunStats()
    async with asyncio.TaskGroup() as group:
        server = group.create_task(broker.serve())
        async with memory_shard(broker, load_scenario(VILLAGE), config, tmp_path / "one.db", stats,
                                asyncio.Event()) as shard:
            await shard.start()
            await shard.run(until=shard.end)
            await shard.bus.wait_sent()
        server.cancel()
    batches = [t for t, _ in broker.published if t.endswith("/events") or t.endswith("/inbox")]
    dones = [m for t, p in broker.published if t == topics.barrier("mem", "0")
             for m in [decode_barrier(p)] if isinstance(m, TickDone)]
    assert batches == [] and len(dones) == 25 and all(d.batches == {} for d in dones)
    assert stats.bus.events_local > 0 and stats.inferences > 0
    assert stats.barrier_seconds == 0.0 and stats.stalls == 0  # nothing to wait for: no virtual time passed


def test_an_npcs_neighbours_are_its_place_but_itself_without_a_copy() -> None:
    import random

    from sim.shard._context import _Others

    for n in range(6):
        place = tuple(sorted(f"n{i}" for i in range(n)))
        for who in (*place, "stranger"):
            others = _Others(place, who)
            expected = tuple(x for x in place if x != who)
            assert tuple(others) == expected and len(others) == len(expected) and bool(others) == bool(expected)
            assert [others[i] for i in range(-len(expected), 0)] == list(expected)
            for seed in range(4):  # the brain draws from it as from the tuple the engine used to copy
                if expected:
                    assert random.Random(seed).choice(others) == random.Random(seed).choice(expected)
