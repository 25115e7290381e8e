"""Persona presets: what NPCs say unprompted and what load-test bots say to them.

Plain data, chosen from with an agent's own seeded generator, so runs stay reproducible.
"""

from __future__ import annotations

__all__ = ["AMBIENT_PROMPTS", "BOT_LINES"]

AMBIENT_PROMPTS: tuple[str, ...] = (
    "You notice {other} nearby. Say something to them.",
    "Make small talk with {other} about the weather.",
    "Ask {other} what news they have heard.",
    "Complain to {other} about the state of things.",
)

BOT_LINES: tuple[str, ...] = (
    "Good day to you.",
    "What do you sell?",
    "Have you heard any rumours?",
    "Where can I find the inn?",
    "Tell me about yourself.",
    "Is it safe on the roads?",
)
