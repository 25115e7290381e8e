"""Bounds on what outside clients may send, and the refusal counter that enforces them.

Players and the game system reach the simulation only through public JSON topics, which
anyone allowed on the broker can write. Over a bound a message is refused whole (never
truncated), counted by kind for the summary, and logged once per kind. Per tick, each
player is heard at most `player_inputs_per_tick` times, each NPC is told at most
`npc_inputs_per_tick` inputs and a shard takes at most `inputs_per_tick` in all
(`limit_player_inputs`): the excess is refused too (its client gets a `rate_limited` error,
or `busy` when the NPC or the shard is the one at its bound), never queued for later. An
NPC makes at most `npc_inferences_per_tick` inferences a tick, whoever asks (sim.shard), so
a flood of players costs a bounded number of model calls. Error replies are bounded per
client and in all (`ErrorReplies`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from sim.wire.channel import Bound, MessageBounds, TextBound
from sim.wire.events import ErrorCode, ErrorMessage
from sim.wire.inputs import OutsideInput, Taken

__all__ = [
    "ErrorReplies", "InputBounds", "OverBound", "Refusals", "bound_problem", "limit_player_inputs",
]

log = logging.getLogger(__name__)


class InputBounds(MessageBounds, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Each message's bounds (`MessageBounds`: the contract's), and the run's per tick. The
    defaults suit a chat-like game; operators raise them per run (RunConfig.limits.bounds)."""

    player_inputs_per_tick: int = 3
    npc_inputs_per_tick: int = 8
    inputs_per_tick: int = 256  # per shard: with one shard, per run
    npc_inferences_per_tick: int = 8
    facts_per_npc: int = 64


def bound_problem(bound: Bound | None, message: Any, bounds: MessageBounds) -> str | None:
    """Why `message` is over `bound` (its channel's, sim.wire.contract) with the run's `bounds`, or None."""
    if bound is None:
        return None
    if isinstance(bound, TextBound):
        chars, text = getattr(bounds, bound.chars), getattr(message, bound.field) or ""  # a fact withdrawn has none
        return f"{bound.field} of {len(text)} characters (bound {chars})" if len(text) > chars else None
    keys, key_chars, value_chars = (getattr(bounds, name) for name in (bound.keys, bound.key_chars, bound.value_chars))
    if len(message.state) > keys:
        return f"{len(message.state)} keys (bound {keys})"
    for key, value in message.state.items():
        if len(key) > key_chars:
            return f"key of {len(key)} characters (bound {key_chars})"
        if len(value) > value_chars:
            return f"value of {key!r} has {len(value)} characters (bound {value_chars})"
    return None


class Refusals:
    """Refused outside input, counted by kind; the first of each kind is logged."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def refuse(self, kind: str, where: str, why: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] == 1:
            log.warning("refused %s on %s: %s (logged once per kind, counted in the summary)", kind, where, why)


class OverBound(NamedTuple):
    """A player's input refused at a tick's bound: `code` is `rate_limited` (the player's own
    bound) or `busy` (the NPC's or the shard's), `why` says which."""

    input: OutsideInput
    code: ErrorCode
    why: str


def limit_player_inputs(inputs: Sequence[Taken], bounds: InputBounds) -> tuple[list[Taken], list[OverBound]]:
    """The inputs a tick takes, in arrival order: each player's first `player_inputs_per_tick`,
    each NPC's first `npc_inputs_per_tick`, and `inputs_per_tick` in all, with the game
    system's inputs (never limited here); and the players' inputs over a bound, to be refused."""
    kept: list[Taken] = []
    over: list[OverBound] = []
    by_player: dict[str, int] = {}
    by_npc: dict[str, int] = {}
    taken_inputs = 0
    for taken in inputs:
        if isinstance(taken, OutsideInput):
            player, npc = by_player.get(taken.player, 0), by_npc.get(taken.to, 0)
            if player >= bounds.player_inputs_per_tick:
                over.append(OverBound(taken, "rate_limited",
                                      f"more than {bounds.player_inputs_per_tick} inputs in one tick"))
                continue
            if npc >= bounds.npc_inputs_per_tick:
                over.append(OverBound(taken, "busy", f"{taken.to!r} is told more than "
                                                     f"{bounds.npc_inputs_per_tick} inputs in one tick; try again"))
                continue
            if taken_inputs >= bounds.inputs_per_tick:
                over.append(OverBound(taken, "busy", f"more than {bounds.inputs_per_tick} inputs in one tick "
                                                     "in all; try again"))
                continue
            by_player[taken.player], by_npc[taken.to] = player + 1, npc + 1
            taken_inputs += 1
        kept.append(taken)
    return kept, over


class ErrorReplies:
    """Error replies to outside clients, bounded per client: at most `per_window` in a window
    of `window` seconds, then one `rate_limited` error, then none until the window ends. A
    flood costs a client a bounded number of replies, `clients` clients in one window at most
    are answered, and `in_all` replies at most in any window, whoever the clients (a flood
    from thousands of ids costs no more); what is held back is counted."""

    def __init__(self, *, per_window: int = 10, window: float = 10.0, clients: int = 10_000,
                 in_all: int = 1_000) -> None:
        self._per_window, self._window, self._clients, self._in_all = per_window, window, clients, in_all
        self._windows: dict[str | None, tuple[float, int]] = {}  # client -> (window start, replies in it)
        self._all: tuple[float, int] = (0.0, 0)  # (window start, replies sent in it), every client's
        self.held = 0

    def admit(self, client: str | None, error: ErrorMessage, now: float) -> ErrorMessage | None:
        """The reply to send `client` (None: the game system) for `error` now, or None (held back)."""
        reply = self._admit(client, error, now)
        if reply is None:
            return None
        start, sent = self._all
        if now - start >= self._window:
            start, sent = now, 0
        if sent >= self._in_all:
            self.held += 1
            return None
        self._all = (start, sent + 1)
        return reply

    def _admit(self, client: str | None, error: ErrorMessage, now: float) -> ErrorMessage | None:
        start, sent = self._windows.get(client, (now, 0))
        if now - start >= self._window:
            start, sent = now, 0
        if len(self._windows) >= self._clients and client not in self._windows:
            self._forget_before(now - self._window)
            if len(self._windows) >= self._clients:  # that many clients erring at once: none more answered
                self.held += 1
                return None
        self._windows[client] = (start, sent + 1)
        if sent < self._per_window:
            return error
        self.held += 1
        if sent > self._per_window:
            return None
        why = f"more than {self._per_window} errors in {self._window:g} s: further errors are held back until then"
        return ErrorMessage(code="rate_limited", message=why, topic=error.topic, id=error.id)

    def _forget_before(self, cutoff: float) -> None:
        """Drop the windows that ended (a flood of client ids keeps the table bounded)."""
        self._windows = {c: w for c, w in self._windows.items() if w[0] > cutoff}
