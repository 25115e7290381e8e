"""Agent kinds and player kinds, by import string: `sim` never imports `agents` by name.

A scenario names an NPC's kind (`kind = "npc"` by default); `AGENT_KINDS` maps it to the
class that runs it, built as `kind(spec, context)` with the agent's `AgentContext` for a
turn, and whose `episode_of(event, addressed)` says what an NPC of that kind remembers of
an event at its place or in its inbox (shared perception: the engine words no memory).
The shard's context resolves the kinds its NPCs name (sim.shard._context.agent_kinds).
Scripted players (from the scenario) and load-test bots live in shard 0 and say their
lines through the same outbox as everything else.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from sim.scenario import Scenario
from sim.wire.events import Speech

__all__ = ["AGENT_KINDS", "PLAYER_KINDS", "Agent", "Player", "players", "resolve"]

AGENT_KINDS: dict[str, str] = {"npc": "agents.npc:NpcAgent"}
PLAYER_KINDS = {"scripted": "agents.player:ScriptedPlayer", "bot": "agents.player:BotPlayer"}


class Agent(Protocol):
    """An agent taking its turn: the shard decides who takes one (mail, or the ambient dice
    fell: `ambient`), builds the agent for it and steps it."""

    id: str

    async def step(self, tick: int, ambient: bool) -> None: ...


class Player(Protocol):
    """A player inside the shard: its inputs are a function of the tick."""

    id: str
    location: str | None

    def inputs(self, tick: int) -> list[Speech]: ...


def resolve(spec: str) -> Any:
    """What an import string `module:attribute` names."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def players(scenario: Scenario, run_id: str, seed: int, *, bots: int, bot_rate: float) -> list[Player]:
    """The scenario's scripted players, then `bots` load-test bots (`bot0`, `bot1`, ...)."""
    scripted = resolve(PLAYER_KINDS["scripted"])
    found: list[Player] = [scripted(p, run_id) for p in scenario.players]
    bot = resolve(PLAYER_KINDS["bot"])
    npc_ids = sorted(spec.id for spec in scenario.npcs)
    found += [bot(f"bot{i}", npc_ids, run_id, seed, bot_rate) for i in range(bots)]
    return found
