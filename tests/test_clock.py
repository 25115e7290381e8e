"""The shard's clocks: virtual time that waits for nothing, and the system's."""

from __future__ import annotations

import asyncio
import time

import pytest

from sim.shard import SystemClock, VirtualClock


async def test_a_virtual_wait_ends_as_soon_as_its_event_is_set_and_time_stands_still() -> None:
    clock = VirtualClock(autojump=60)  # never jumps on its own within this test
    event = asyncio.Event()
    waiter = asyncio.ensure_future(clock.wait(event, 30))
    await asyncio.sleep(0)  # one turn of the loop: the waiter starts waiting (no time passes, nothing is awaited)
    event.set()
    assert await waiter is True
    assert clock.now() == 0.0


async def test_a_virtual_timeout_jumps_when_nothing_happens() -> None:
    clock = VirtualClock(autojump=0.005, start=100.0, wall_start=1_700_000_000.0)
    began = time.monotonic()
    assert await clock.wait(asyncio.Event(), 3600) is False
    assert time.monotonic() - began < 1.0
    assert clock.now() == 3700.0 and clock.wall() == 1_700_003_600.0


async def test_a_shared_clock_wakes_the_earliest_wait_first() -> None:
    clock = VirtualClock(autojump=0.005)
    never = asyncio.Event()
    woke: list[tuple[str, float]] = []

    async def waits(name: str, seconds: float, times: int) -> None:
        for _ in range(times):
            await clock.wait(never, seconds)
            woke.append((name, clock.now()))

    await asyncio.gather(waits("often", 0.01, 5), waits("once", 0.5, 1))
    assert [name for name, _ in woke] == ["often"] * 5 + ["once"]
    assert [t for _, t in woke] == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05, 0.5])


async def test_a_virtual_sleep_ends_early_on_stop_and_jump_moves_time_by_hand() -> None:
    clock = VirtualClock(autojump=60)
    stop = asyncio.Event()
    sleeper = asyncio.ensure_future(clock.sleep(10, stop))
    await asyncio.sleep(0)  # one turn of the loop: the sleeper starts waiting (no time passes, nothing is awaited)
    clock.jump(4)
    stop.set()
    await sleeper
    assert clock.now() == 4.0
    await clock.sleep(-1, stop)  # a tick that overran its pacing: no wait at all
    with pytest.raises(ValueError, match="does not go back"):
        clock.jump(-1)


async def test_the_system_clock_waits_in_real_time() -> None:
    clock = SystemClock()
    event = asyncio.Event()
    began = clock.now()
    assert await clock.wait(event, 0.05) is False
    assert clock.now() - began >= 0.04
    event.set()
    assert await clock.wait(event, 60) is True
    assert abs(clock.wall() - time.time()) < 1


async def test_a_pacing_sleep_ends_early_when_something_arrives() -> None:
    for clock in (VirtualClock(autojump=60), SystemClock()):
        stop, wake = asyncio.Event(), asyncio.Event()
        sleeper = asyncio.ensure_future(clock.sleep(30, stop, wake))
        await asyncio.sleep(0)  # one turn of the loop: the sleeper starts waiting
        wake.set()
        async with asyncio.timeout(5):  # the subject: it ends now, not in 30 s
            await sleeper
        assert not stop.is_set()
