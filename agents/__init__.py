"""Behaviours that run on the engine: the NPC brain, players, load-test bots."""

__all__: list[str] = []  # each behaviour is imported from its module (agents.npc, agents.player)
