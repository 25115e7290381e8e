"""Agents' pure parts: seeded generators, bots, scripted players, the scenario generator."""

from __future__ import annotations

from agents.npc import agent_rng
from agents.player import BotPlayer, ScriptedPlayer
from sim.generate import generate_scenario
from sim.scenario import load_scenario, parse_scenario
from tests.conftest import REPO


def test_agent_rng_depends_on_seed_and_id_only() -> None:
    draws = [agent_rng(7, "smith").random() for _ in range(2)]
    assert draws[0] == draws[1]
    assert agent_rng(7, "smith").random() != agent_rng(8, "smith").random()
    assert agent_rng(7, "smith").random() != agent_rng(7, "baker").random()


def test_scripted_player_says_its_lines_at_their_ticks() -> None:
    spec = load_scenario(REPO / "scenarios" / "village.toml").players[0]
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


def test_generated_world_loads() -> None:
    scenario = parse_scenario(generate_scenario(npcs=50, locations=7, seed=3))
    assert len(scenario.npcs) == 50
    assert {n.location for n in scenario.npcs} == {f"l{j}" for j in range(7)}
