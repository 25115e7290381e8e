"""How requests are spread over several model servers, without I/O: each NPC's order of the
servers (rendezvous hashing), each NPC's slot of a server (`SlotTable`) and each server's
adaptive limit on requests in flight (AIMD).

Rendezvous hashing gives each NPC the same first server run after run, so its prompts meet
the server's prompt cache; a server added or removed moves only the NPCs that rank it first.
Slots are few (a llama.cpp server has a handful), so hashing every NPC onto them would make
two of three NPCs share one while another idles: the first NPCs take a slot each, and only
those beyond the slots are hashed onto them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

__all__ = ["AdaptiveLimit", "SlotTable", "rendezvous_order"]

_SMOOTHING = 0.2  # the weight of each answer's latency in the moving average


def _score(key: str, server: str) -> int:
    digest = hashlib.sha256(f"{server}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rendezvous_order(key: str, servers: Sequence[str]) -> list[str]:
    """`servers` in `key`'s order: highest score first, ties (none in practice) by name."""
    return sorted(servers, key=lambda server: (-_score(key, server), server))


class SlotTable:
    """Which of a server's `slots` each NPC's requests go to, so that its last prompt is still in
    that slot's cache: the first NPCs served take a slot each; once every slot is taken, an NPC
    shares the slot rendezvous hashing ranks first for it. So NPCs share a slot only when they
    outnumber the slots, and an NPC's slot never changes."""

    def __init__(self, slots: int) -> None:
        self._own: dict[str, int] = {}  # the NPCs that took a slot of their own
        self._names = [str(n) for n in range(slots)]

    def __len__(self) -> int:
        return len(self._names)

    def slot(self, agent_id: str) -> int:
        slot = self._own.get(agent_id)
        if slot is None:
            if len(self._own) < len(self._names):
                slot = self._own[agent_id] = len(self._own)
            else:
                slot = int(rendezvous_order(agent_id, self._names)[0])
        return slot


class AdaptiveLimit:
    """How many requests one server gets at once: additive increase, multiplicative decrease.

    Starts at `ceiling` (the run's `--concurrency`) and stays within [1, ceiling]. Each answer
    adds 1/limit (so one per full round of answers). An overload (429, 503) multiplies it by
    `decrease`, and so do answers that took more than `tolerance` times the server's own time
    for them (both as moving averages): the rest is time they waited at the server, in its
    queue. The server's own time is what tells a queue from a longer prompt, since a model's
    requests differ in cost many times over; a server that does not say it is cut only by
    overloads. Only answers to requests started after the last decrease can decrease it again:
    one overload seen by many requests in flight counts once. The clock is injectable (a
    virtual one in tests).
    """

    def __init__(
        self, ceiling: int, *, decrease: float = 0.7, tolerance: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ceiling < 1 or not 0 < decrease < 1 or not tolerance > 1:
            raise ValueError(f"ceiling >= 1, 0 < decrease < 1, tolerance > 1; got {ceiling}, {decrease}, {tolerance}")
        self.ceiling = ceiling
        self.decrease = decrease
        self.tolerance = tolerance
        self.clock = clock
        self._limit = float(ceiling)
        self._latency: float | None = None  # the moving averages of the answers' latency ...
        self._served = 0.0  # ... and of the server's own time for them, in seconds
        self._decreased_at = float("-inf")
        self.decreases = 0

    @property
    def limit(self) -> int:
        """The requests allowed in flight now."""
        return max(1, min(self.ceiling, int(self._limit)))

    def start(self) -> float:
        """A request starts now: the time to give back to `answered` or `overloaded`."""
        return self.clock()

    def answered(self, started: float, served: float | None = None) -> None:
        """A request started at `started` was answered; `served`: the seconds the server says it
        spent on it (evaluating the prompt and generating), None when it does not say."""
        if served is not None:
            latency = max(0.0, self.clock() - started)
            if self._latency is None:
                self._latency, self._served = latency, served
            self._latency += _SMOOTHING * (latency - self._latency)
            self._served += _SMOOTHING * (served - self._served)
            if self._latency > self.tolerance * self._served and self._cut(started):
                return
        self._limit = min(float(self.ceiling), self._limit + 1 / max(self._limit, 1.0))

    def overloaded(self, started: float) -> None:
        """The server refused a request started at `started` as too busy (429, 503)."""
        self._cut(started)

    def _cut(self, started: float) -> bool:
        """Decrease once per round of requests; whether it did."""
        if started <= self._decreased_at:
            return False
        self._limit = max(1.0, self._limit * self.decrease)
        self._decreased_at = self.clock()
        self.decreases += 1
        return True
