"""Behaviours that run on the engine: the NPC brain, players, load-test bots."""
