"""Agents' pure parts: seeded generators, bots, scripted players, the scenario generator."""

from __future__ import annotations

from agents.npc import agent_rng
from agents.player import BotPlayer, ScriptedPlayer
from sim.generate import generate_scenario
from sim.scenario import load_scenario, parse_scenario
from sim.shard import ambient_roll
from tests.helpers import VILLAGE


def test_agent_dice_depend_on_seed_id_and_tick_only() -> None:
    draws = [agent_rng(7, "smith", 3).random() for _ in range(2)]
    assert draws[0] == draws[1]
    assert agent_rng(7, "smith", 3).random() != agent_rng(8, "smith", 3).random()
    assert agent_rng(7, "smith", 3).random() != agent_rng(7, "baker", 3).random()
    assert agent_rng(7, "smith", 3).random() != agent_rng(7, "smith", 4).random()
    rolls = [ambient_roll(7, "smith", t) for t in range(2000)]
    assert rolls == [ambient_roll(7, "smith", t) for t in range(2000)]
    assert all(0 <= r < 1 for r in rolls) and 0.45 < sum(rolls) / len(rolls) < 0.55


def test_scripted_player_says_its_lines_at_their_ticks() -> None:
    spec = load_scenario(VILLAGE).players[0]
    player = ScriptedPlayer(spec, "r")
    said = [e for tick in range(20) for e in player.inputs(tick)]
    assert [(e.tick, e.to) for e in said] == [(line.tick, line.to) for line in spec.script]
    assert all(e.from_player and e.speaker == "player" for e in said)
    assert len({e.id for e in said}) == len(said)


def test_bots_are_reproducible() -> None:
    def lines() -> list[tuple[int, str | None, str]]:
        bot = BotPlayer("bot0", ["a", "b"], "r", seed=1, rate=0.5)
        return [(e.tick, e.to, e.text) for t in range(50) for e in bot.inputs(t)]

    assert lines() == lines()
    assert lines()
    resumed = BotPlayer("bot0", ["a", "b"], "r", seed=1, rate=0.5)
    assert [(e.tick, e.to, e.text) for t in range(25, 50) for e in resumed.inputs(t)] == [
        x for x in lines() if x[0] >= 25
    ]


def test_generated_world_loads() -> None:
    scenario = parse_scenario(generate_scenario(npcs=50, locations=7, seed=3))
    assert len(scenario.npcs) == 50
    assert {n.location for n in scenario.npcs} == {f"l{j}" for j in range(7)}
