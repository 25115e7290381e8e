"""The NPC brain: perceive, remember, decide, speak.

Each tick the shard wakes the NPCs that have mail or whose ambient dice fell
(sim.shard.ambient_roll). `NpcAgent.episode_of` is what an NPC remembers of an event of its
place or its inbox, with a significance; a line is remembered in the speaker's own words
(`sim.memory.quoted`), so a retold line never nests quotes. A line said to it also goes into
its dialogue; the line and the memory name the event they record, so a prompt says it once
(`sim.memory.distinct`), and the line it answers is said once, as the input. It answers every
player who addressed it (its answer carries the id the player's client gave the input), else
the first NPC who did (while the exchange is short), else says something to a neighbour. It
reaches the engine only through its `AgentContext`: `speak` is one call, and what a line goes
through is the engine's business.

Nothing it decides depends on state carried between ticks outside the store: its dice are a
function of (seed, id, tick) and its sequence numbers restart each tick, so a run resumed
after a crash decides exactly as one that never stopped.
"""

from __future__ import annotations

import hashlib
import random

from agents.personas import AMBIENT_PROMPTS
from sim.memory import Episode, Line, quoted
from sim.scenario import NpcSpec
from sim.shard import AgentContext
from sim.wire.events import AnyEvent, Notice, Speech

__all__ = ["MAX_NPC_TURNS", "NpcAgent", "agent_rng"]

MAX_NPC_TURNS = 2
"""An NPC answers an NPC's line only while fewer than this many replies were exchanged."""


def agent_rng(seed: int, agent_id: str, tick: int) -> random.Random:
    """The agent's generator for one tick, derived from the run seed, its id and the tick."""
    digest = hashlib.sha256(f"{seed}:{agent_id}:{tick}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class NpcAgent:
    """One NPC taking its turn: the shard builds it for `step(tick, ambient)` when it has mail
    or its ambient dice fell (`ambient`), and drops it afterwards."""

    __slots__ = ("_ctx", "id", "name", "spec")

    def __init__(self, spec: NpcSpec, ctx: AgentContext) -> None:
        self.spec = spec
        self.id = spec.id
        self.name = spec.name
        self._ctx = ctx

    @property
    def location(self) -> str:
        """Where it stands now (it walks: its routine, `go_to`, the game)."""
        return self._ctx.location

    @staticmethod
    def episode_of(event: AnyEvent, addressed: bool) -> Episode:
        """What an NPC remembers of an event it perceived (at its place or in its inbox):
        a notice as the game system told it; a line as who said it to whom, the more
        significant when said to it, the most when a player said it. The engine keeps one
        such memory per event for everyone it was not addressed to. The memory names its
        event, as the line in the dialogue does."""
        if isinstance(event, Notice):
            return Episode(id=f"ev:{event.id}", tick=event.tick, text=event.text, significance=event.significance,
                           event=event.id)
        target = "me" if addressed else (event.to or "everyone")
        significance = 0.9 if addressed and event.from_player else 0.7 if addressed else 0.3
        text = f"{event.speaker} said to {target}: {quoted(event.text)}"
        return Episode(id=f"ev:{event.id}", tick=event.tick, text=text, significance=significance, event=event.id)

    async def step(self, tick: int, ambient: bool) -> None:
        events = await self._ctx.mail(tick)
        replies: list[Speech] = []
        npc_reply: Speech | None = None
        for event in events:
            if not isinstance(event, Speech) or event.speaker == self.id or event.to != self.id:
                continue
            await self._hear(event, tick)
            if event.from_player:
                replies.append(event)
            elif npc_reply is None and event.turn < MAX_NPC_TURNS:
                npc_reply = event
        if npc_reply is not None:
            replies.append(npc_reply)
        for heard in replies:
            await self._ctx.speak(heard.speaker, f"{heard.speaker}: {heard.text}", heard.turn + 1,
                                  reply_to=heard.input_id, answering=heard.id)
        if not replies and ambient:
            others = self._ctx.neighbours()
            if others:
                rng = agent_rng(self._ctx.seed, self.id, tick)
                other = rng.choice(others)
                prompt = rng.choice(AMBIENT_PROMPTS).format(other=other)
                await self._ctx.speak(other, prompt, 0)

    async def _hear(self, event: Speech, tick: int) -> None:
        """Said to it: a line of its dialogue, heard in this tick, numbered in its sequence,
        naming the event it was said in."""
        ctx = self._ctx
        await ctx.remember(Line(tick=tick, speaker=event.speaker, text=event.text, seq=ctx.next_seq(), event=event.id))
