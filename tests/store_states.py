"""A small NPC state the store tests write and read back."""

from __future__ import annotations

from sim.memory import Belief, Episode, Fact, Line, NpcState, WorldFact

__all__ = ["village_state"]


def village_state(agent_id: str = "smith") -> NpcState:
    return NpcState(
        agent_id=agent_id,
        system_prompt=f"You are {agent_id}, the village smith.",
        canonical_facts=(Fact(id="king", text="The king is dead."),),
        world_state=(WorldFact(key="weather", value="rain"),),
        episodic=(Episode(id="e0", tick=0, text="Forged a sword."),),
        beliefs=(Belief(id="b0", tick=0, text="The mayor lies.", confidence=0.7),),
        dialogue=(Line(tick=0, speaker="player", text="Hello"),),
    )
