"""Canonical facts from the game system (`game/fact`): added, replaced or withdrawn, by id.

A fact for one NPC is taken by the shard that holds it; a fact for every NPC by every
shard at the same tick (it travels in shard 0's `TickDone`). Every refusal follows from
what every layout of the run holds alike (the NPC's facts, the facts for every NPC the
run took, the scenario's), so the run is the same on any number of shards; one shard
answers it (the NPC's, or shard 0).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from sim.bus import Bus
from sim.day import GOAL_FACT, goal_text
from sim.memory import Fact, OverBudgetError, build_working_memory, counted_by_server
from sim.protocol.received import InputRefused, refused
from sim.shard._clock import checkpoint
from sim.shard._plan import ShardPlan
from sim.store import Store, Writer
from sim.wire import topics
from sim.wire.events import ErrorCode
from sim.wire.inputs import GameFact

__all__ = ["GameFacts"]

_SLICE = 20_000  # NPCs given a fact for every NPC between two yields


class GameFacts:
    """The game's facts as a shard takes them; `run_wide` are the ids of the facts for every
    NPC taken so far and not withdrawn (the store's, read again on resume)."""

    def __init__(self, plan: ShardPlan, store: Store, bus: Bus,
                 answer: Callable[[InputRefused], Awaitable[None]]) -> None:
        self._plan, self._store, self._bus, self._answer = plan, store, bus, answer
        self.run_wide: set[str] = set()
        self._scenario = frozenset(f.id for spec in plan.scenario.npcs for f in spec.facts)

    async def set_goal(self, npc: str, goal: str | None) -> None:
        """NPC `npc`'s goal as the game sets it: its goal fact (`GOAL_FACT`) added, replaced or
        withdrawn (None), what it knows in every prompt until the game changes it again."""
        held = self._store.fact_text(npc, GOAL_FACT) is not None
        if goal is None:
            if held:
                await self.take(GameFact(npc=npc, id=GOAL_FACT, text=None, action="withdraw"))
            return
        await self.take(GameFact(npc=npc, id=GOAL_FACT, text=goal_text(goal), action="replace" if held else "add"))

    async def take(self, fact: GameFact) -> bool:
        """Add, replace or withdraw `fact`; whether it changed anything on this shard."""
        return await (self._add(fact) if fact.action == "add" else self._change(fact))

    async def _add(self, fact: GameFact) -> bool:
        """Add a canonical fact with the game system's authority: to its NPC, refused when the
        NPC holds its id already; or to every NPC of the shard that does not hold its id yet
        (one that does keeps its own), refused when a fact for every NPC has that id."""
        layout, store = self._plan.layout, self._store
        local = layout.local
        if fact.npc is not None:
            if fact.npc not in local:
                return False
            if store.fact_text(fact.npc, fact.id) is not None:
                await self._refuse(fact, f"NPC {fact.npc!r} holds a fact {fact.id!r} already", answer=True)
                return False
            why = self._problem(fact.npc, fact)
            if why is not None:
                await self._refuse(fact, why, answer=True, code="over_budget")
                return False
            agents = [fact.npc]
        else:
            if fact.id in self.run_wide:
                await self._refuse(fact, f"a fact {fact.id!r} for every NPC was added already",
                                   answer=layout.index == 0)
                return False
            self.run_wide.add(fact.id)
            agents = [s.id for s in layout.specs if store.fact_text(s.id, fact.id) is None]
            held = [agent for agent in agents if self._problem(agent, fact) is None]
            if len(held) < len(agents):  # each NPC's own state decides: the same on any layout
                self._bus.refuse("game fact an NPC cannot hold", topics.game_fact(self._plan.run_id),
                                 f"fact {fact.id!r}: {len(agents) - len(held)} NPCs of this shard cannot hold it")
            agents = held
        for n, agent in enumerate(agents, start=1):
            await store.add_fact(agent, Fact(id=fact.id, text=fact.text or ""), writer=Writer.GAME)
            if n % _SLICE == 0:
                await checkpoint()
        return True

    async def _change(self, fact: GameFact) -> bool:
        """Replace or withdraw a fact with the game system's authority: its NPC's, refused
        `no_fact` when the NPC does not hold it (or `over_budget` for a new text it cannot
        hold); or every NPC's of the shard that holds it, refused (by shard 0) when the run
        never had it for every NPC (the scenario's, or one added for every NPC): what every
        layout knows alike. A fact for every NPC withdrawn may be added again."""
        layout, store = self._plan.layout, self._store
        if fact.npc is not None:
            if fact.npc not in layout.local:
                return False
            if store.fact_text(fact.npc, fact.id) is None:
                await self._refuse(fact, f"NPC {fact.npc!r} holds no fact {fact.id!r}", answer=True,
                                   code="no_fact")
                return False
            agents = [fact.npc]
        else:
            if fact.id not in self.run_wide and fact.id not in self._scenario:
                await self._refuse(fact, f"no fact {fact.id!r} for every NPC", answer=layout.index == 0,
                                   code="no_fact")
                return False
            agents = [s.id for s in layout.specs if store.fact_text(s.id, fact.id) is not None]
        if fact.action == "withdraw":
            for agent in agents:
                await store.withdraw_fact(agent, fact.id, writer=Writer.GAME)
            if fact.npc is None:
                self.run_wide.discard(fact.id)
            return True
        held = [agent for agent in agents if self._problem(agent, fact) is None]
        if len(held) < len(agents):
            if fact.npc is not None:
                await self._refuse(fact, str(self._problem(fact.npc, fact)), answer=True,
                                   code="over_budget")
                return False
            self._bus.refuse("game fact an NPC cannot hold", topics.game_fact(self._plan.run_id),
                             f"fact {fact.id!r}: {len(agents) - len(held)} NPCs of this shard cannot hold it")
        for agent in held:
            await store.replace_fact(agent, Fact(id=fact.id, text=fact.text or ""), writer=Writer.GAME)
        return True

    def _problem(self, agent: str, fact: GameFact) -> str | None:
        """Why `agent` cannot hold `fact`, or None: it holds `facts_per_npc` facts already, or
        with it the mandatory part of its prompt would not fit its budget (refused when the fact
        arrives, not found over budget in every later prompt). A budget counted by a server's
        tokenizer is checked by the prompts themselves: its counts are not at hand here."""
        state, bound = self._store.state(agent), self._plan.config.limits.bounds.facts_per_npc
        others = tuple(f for f in state.canonical_facts if f.id != fact.id)  # a replaced fact's old text goes
        if len(others) >= bound:
            return f"NPC {agent!r} holds {len(state.canonical_facts)} facts, its bound"
        config = self._plan.scenario.memory
        if counted_by_server(config) or not config.always_include_canonical_facts:
            return None
        held = msgspec.structs.replace(state, canonical_facts=(*others, Fact(id=fact.id, text=fact.text or "")))
        try:
            over = build_working_memory(held, "", config).report.over_budget
        except OverBudgetError:
            over = True
        return f"with fact {fact.id!r}, NPC {agent!r}'s mandatory prompt would not fit its budget" if over else None

    async def _refuse(self, fact: GameFact, why: str, *, answer: bool, code: ErrorCode = "exists") -> None:
        """Count a refused fact on this shard; `answer`: this shard answers it (`exists`, or
        `over_budget` for a fact its NPC cannot hold)."""
        topic = topics.game_fact(self._plan.run_id)
        if answer:
            reason = f"{why}; replace it with action \"replace\"" if code == "exists" else why
            await self._answer(refused(code, topic, reason, input_id=fact.id))
        kind = {"exists": "game fact that exists", "no_fact": "game fact to change that is not held"}
        self._bus.refuse(kind.get(code, "game fact over an NPC's bound"), topic, f"fact {fact.id!r}")
