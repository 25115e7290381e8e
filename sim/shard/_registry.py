"""Agent kinds and player kinds, by import string: `sim` never imports `agents` by name.

A scenario names an NPC's kind (`kind = "npc"` by default); `AGENT_KINDS` maps it to the
class that runs it, built as `kind(spec, context)` with the agent's `AgentContext` for a
turn, and whose `episode_of(event, addressed)` says what an NPC of that kind remembers of
an event at its place or in its inbox (shared perception: the engine words no memory).
Scripted players (from the scenario) and load-test bots live in shard 0 and say their
lines through the same outbox as everything else.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sim.errors import ConfigError
from sim.scenario import NpcSpec, Scenario
from sim.shard._perception import EpisodeOf
from sim.wire.events import Speech

if TYPE_CHECKING:  # the contexts build agents through this registry: no import circle at run time
    from sim.shard._context import AgentContext

__all__ = ["AGENT_KINDS", "PLAYER_KINDS", "Agent", "AgentFactory", "AgentKind", "Player", "agent_kinds", "players"]

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


AgentFactory = Callable[[NpcSpec, "AgentContext"], Agent]


class AgentKind(NamedTuple):
    """A kind of agent: how to build one for a turn, and what one remembers of an event."""

    build: AgentFactory
    episode_of: EpisodeOf


def _resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def agent_kinds(specs: Iterable[NpcSpec]) -> dict[str, AgentKind]:
    """Every kind these NPCs name; ConfigError names an NPC of an unknown or incomplete kind."""
    kinds: dict[str, AgentKind] = {}
    for spec in specs:
        if spec.kind in kinds:
            continue
        path = AGENT_KINDS.get(spec.kind)
        if path is None:
            raise ConfigError(f"npc {spec.id!r}: unknown kind {spec.kind!r}; known: {sorted(AGENT_KINDS)}")
        build = _resolve(path)
        episode_of = getattr(build, "episode_of", None)  # resolved once: the same function for every NPC
        if not callable(episode_of):
            raise ConfigError(f"npc {spec.id!r}: kind {spec.kind!r} ({path}) has no episode_of(event, addressed)")
        kinds[spec.kind] = AgentKind(build, episode_of)
    return kinds


def players(scenario: Scenario, run_id: str, seed: int, *, bots: int, bot_rate: float) -> list[Player]:
    """The scenario's scripted players, then `bots` load-test bots (`bot0`, `bot1`, ...)."""
    scripted = _resolve(PLAYER_KINDS["scripted"])
    found: list[Player] = [scripted(p, run_id) for p in scenario.players]
    bot = _resolve(PLAYER_KINDS["bot"])
    npc_ids = sorted(spec.id for spec in scenario.npcs)
    found += [bot(f"bot{i}", npc_ids, run_id, seed, bot_rate) for i in range(bots)]
    return found
