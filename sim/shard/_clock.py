"""Where the shard reads time and waits: the `Clock`, the system's and a virtual one.

Every wait of the shard goes through its clock: the pacing sleep between ticks (cut short
when something arrives: outside input may begin the next tick at once), the
barrier's poll, and the inference deadline, start time and tick durations it reads. This
module is the only one in sim.shard that touches the time and sleep functions of `time`
and `asyncio` (a test checks it).

`VirtualClock` is for tests and embedders, as trio ships `MockClock`: virtual time stands
still while things happen and jumps when nothing does. A wait resolves as soon as its
event is set; when nothing resolved it for `autojump` real seconds, virtual time jumps to
the earliest deadline of the clock's pending waits, so a stall of 5 virtual seconds takes
milliseconds. Its wall time starts at the real one, so deadlines on the wire (unix seconds,
checked by real workers) keep their meaning.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "VirtualClock", "checkpoint"]


class Clock(Protocol):
    """What the shard reads time from and waits on."""

    def now(self) -> float:
        """Monotonic seconds (durations, pacing, the barrier's patience)."""
        ...

    def wall(self) -> float:
        """Unix time (the status topic, inference deadlines)."""
        ...

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        """Until `event` is set (True) or `seconds` have passed (False): the clock's one timeout."""
        ...

    async def sleep(self, seconds: float, stop: asyncio.Event, wake: asyncio.Event | None = None) -> None:
        """Wait `seconds`, or less when `stop` (or `wake`) is set: for pacing, which something
        that arrived may cut short."""
        ...


class SystemClock:
    """Real time: `time.monotonic`, `time.time` and asyncio's timeouts."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await event.wait()
        return event.is_set()

    async def sleep(self, seconds: float, stop: asyncio.Event, wake: asyncio.Event | None = None) -> None:
        if wake is None:
            await self.wait(stop, seconds)
            return
        waits = [asyncio.ensure_future(e.wait()) for e in (stop, wake)]
        try:
            await asyncio.wait(waits, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()


class _Timer:
    """A pending wait's deadline in virtual time; `fired` is set when time reaches it."""

    __slots__ = ("deadline", "fired", "order")

    def __init__(self, deadline: float, order: int) -> None:
        self.deadline = deadline
        self.order = order
        self.fired = asyncio.Event()

    def __lt__(self, other: _Timer) -> bool:
        return (self.deadline, self.order) < (other.deadline, other.order)


class VirtualClock:
    """Virtual time that jumps to the next deadline once nothing happened for `autojump` real seconds.

    "Something happened" is any of the clock's waits beginning or ending, or a jump. `jump`
    moves it by hand. Share one clock between tasks (several shards, an in-memory broker)
    and they all see the same time: a jump wakes the earliest waits first.
    """

    def __init__(self, *, autojump: float = 0.01, start: float = 0.0, wall_start: float | None = None) -> None:
        if autojump < 0:
            raise ValueError(f"autojump must be >= 0 seconds, got {autojump}")
        self.autojump = autojump
        self._now = start
        self._wall_offset = (time.time() if wall_start is None else wall_start) - start
        self._timers: list[_Timer] = []
        self._order = itertools.count()
        self._active = time.monotonic()  # real time of the last thing that happened

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall_offset + self._now

    def jump(self, seconds: float) -> None:
        """Move virtual time forward by `seconds`, waking the waits whose deadline it passes."""
        if seconds < 0:
            raise ValueError(f"time does not go back: jump({seconds})")
        self._advance(self._now + seconds)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        await self._first((event,), seconds)
        return event.is_set()

    async def sleep(self, seconds: float, stop: asyncio.Event, wake: asyncio.Event | None = None) -> None:
        await self._first((stop,) if wake is None else (stop, wake), seconds)

    async def _first(self, events: tuple[asyncio.Event, ...], seconds: float) -> None:
        """Until one of `events` is set or `seconds` of virtual time have passed."""
        if any(e.is_set() for e in events) or seconds <= 0:
            return
        timer = _Timer(self._now + seconds, next(self._order))
        heapq.heappush(self._timers, timer)
        self._active = time.monotonic()
        waits = [asyncio.ensure_future(e.wait()) for e in (*events, timer.fired)]
        try:
            while True:
                quiet = time.monotonic() - self._active
                if quiet >= self.autojump and not timer.fired.is_set():
                    self._advance(self._timers[0].deadline)  # nothing happened for `autojump` real seconds
                done, _ = await asyncio.wait(
                    waits, timeout=max(0.0, self.autojump - quiet), return_when=asyncio.FIRST_COMPLETED
                )
                if done:
                    return
        finally:
            for waiting in waits:
                waiting.cancel()
            if not timer.fired.is_set():
                self._timers.remove(timer)
                heapq.heapify(self._timers)
            self._active = time.monotonic()

    def _advance(self, to: float) -> None:
        self._now = max(self._now, to)
        self._active = time.monotonic()
        while self._timers and self._timers[0].deadline <= self._now:
            heapq.heappop(self._timers).fired.set()


async def checkpoint() -> None:
    """Let the other tasks run (no wait: `asyncio.sleep(0)`), between chunks of long work."""
    await asyncio.sleep(0)
