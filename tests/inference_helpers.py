"""Shared builders for the inference tests: a small NPC state, requests from it, a scripted
backend, and running remote workers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from sim.inference import InferenceRequest, Priority, RemoteWorker, Reply
from sim.memory import (
    Belief,
    Fact,
    Line,
    NpcState,
    WorkingMemory,
    WorkingMemoryConfig,
    WorldFact,
    build_working_memory,
)

FALLBACKS = ("The forge needs me; ask again later.", "Hmm. Not now, friend.")


def smith_state(agent: str = "mara") -> NpcState:
    return NpcState(
        agent_id=agent,
        system_prompt="You are Mara, the village blacksmith: gruff, honest, proud of her work.",
        canonical_facts=(
            Fact(id="f1", text="The old bridge is broken."),
            Fact(id="f2", text="Tom is the mayor of the village."),
        ),
        world_state=(WorldFact(key="weather", value="rain"),),
        beliefs=(Belief(id="b1", tick=3, text="the miller waters down his flour"),),
        dialogue=(Line(tick=4, speaker="traveller", text="Good morning, smith."),),
    )


def make_request(
    n: int = 0,
    *,
    agent: str = "mara",
    priority: Priority = Priority.NPC,
    deadline_in: float = 10.0,
    fallback_lines: tuple[str, ...] = FALLBACKS,
    said: str = "traveller: Is the bridge safe to cross?",
) -> InferenceRequest:
    state = smith_state(agent)
    config = WorkingMemoryConfig()
    memory = build_working_memory(state, said, config)
    return InferenceRequest(
        id=f"req-{agent}-{n}", run_id="test", agent_id=agent, tick=n, memory=memory, priority=priority,
        deadline=time.time() + deadline_in, fallback_lines=fallback_lines, seed=7, state=state, config=config,
    )


class ScriptBackend:
    """A backend that answers from a list, recording the prohibitions of the memories it was given."""

    name = "script"
    model = "script-1"
    prompt_form = "text"
    prompt_prefix = ""

    def __init__(self, texts: list[str], fail: Exception | None = None) -> None:
        self.texts = texts
        self.fail = fail
        self.prohibitions: list[str | None] = []

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None) -> Reply:
        self.prohibitions.append(memory.prohibition)
        if self.fail is not None:
            raise self.fail
        return Reply(text=self.texts.pop(0), model=self.model)


@asynccontextmanager
async def running(*workers: RemoteWorker) -> AsyncIterator[None]:
    """Run in-process remote workers until the block ends; wait until all are subscribed."""
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(w.run()) for w in workers]
        async with asyncio.timeout(10):
            for w in workers:
                await w.ready.wait()
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
