"""Shared builders for the inference tests: a small NPC state and requests from it."""

from __future__ import annotations

import time

from sim.inference import InferenceRequest, Priority
from sim.memory import Belief, Fact, Line, NpcState, WorkingMemoryConfig, WorldFact, build_working_memory

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
