"""Bounds on what outside clients may send, and the refusal counter that enforces them.

Players and the game system reach the simulation only through public JSON topics, which
anyone allowed on the broker can write. Over a bound a message is refused whole (never
truncated), counted by kind for the summary, and logged once per kind. Per tick, each
player is heard at most `player_inputs_per_tick` times (`limit_player_inputs`): the excess
is refused too, never queued for later.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import msgspec

from sim.wire.events import PlayerInputMessage, WorldStateMessage

__all__ = ["InputBounds", "Refusals", "limit_player_inputs", "player_input_problem", "world_state_problem"]

log = logging.getLogger(__name__)


class InputBounds(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The defaults suit a chat-like game; operators raise them per run (RunConfig.limits.bounds)."""

    player_text_chars: int = 500
    player_inputs_per_tick: int = 3
    world_keys: int = 64
    world_key_chars: int = 64
    world_value_chars: int = 256


def player_input_problem(message: PlayerInputMessage, bounds: InputBounds) -> str | None:
    """Why this input is refused, or None."""
    if len(message.text) > bounds.player_text_chars:
        return f"text of {len(message.text)} characters (bound {bounds.player_text_chars})"
    return None


def world_state_problem(message: WorldStateMessage, bounds: InputBounds) -> str | None:
    """Why this world-state message is refused, or None: too many keys, a key or value too long."""
    if len(message.state) > bounds.world_keys:
        return f"{len(message.state)} keys (bound {bounds.world_keys})"
    for key, value in message.state.items():
        if len(key) > bounds.world_key_chars:
            return f"key of {len(key)} characters (bound {bounds.world_key_chars})"
        if len(value) > bounds.world_value_chars:
            return f"value of {key!r} has {len(value)} characters (bound {bounds.world_value_chars})"
    return None


class Refusals:
    """Refused outside input, counted by kind; the first of each kind is logged."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def refuse(self, kind: str, where: str, why: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] == 1:
            log.warning("refused %s on %s: %s (logged once per kind, counted in the summary)", kind, where, why)


class _Refuser(Protocol):
    def refuse(self, kind: str, where: str, why: str) -> None: ...


def limit_player_inputs(
    inputs: Sequence[tuple[str, PlayerInputMessage]], per_tick: int, refuser: _Refuser
) -> list[tuple[str, PlayerInputMessage]]:
    """The first `per_tick` inputs of each player, in arrival order; the rest refused and counted."""
    kept: list[tuple[str, PlayerInputMessage]] = []
    seen: dict[str, int] = {}
    for player, message in inputs:
        seen[player] = seen.get(player, 0) + 1
        if seen[player] <= per_tick:
            kept.append((player, message))
        else:
            refuser.refuse("player inputs over the per-tick bound", f"player {player!r}",
                           f"more than {per_tick} inputs in one tick")
    return kept
