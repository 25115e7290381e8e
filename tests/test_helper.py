"""Helper processes (sim.helper) are reaped however their owner ends: stopped, aborted, or
cancelled while it stops them."""

from __future__ import annotations

import asyncio
import gc

import pytest

from sim.helper import Helper


async def test_a_stuck_helper_is_killed_when_stopped() -> None:
    helper = await Helper.start("tests.stubborn_child", b"", what="test child")
    await helper.stop()
    assert helper.process.returncode is not None


async def test_a_helper_whose_owner_is_cancelled_while_stopping_it_is_reaped() -> None:
    helper = await Helper.start("tests.stubborn_child", b"", what="test child")
    stopping = asyncio.create_task(helper.stop())
    await asyncio.sleep(0)  # stop() is now waiting for the child to end
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert helper.process.returncode is not None


async def test_a_helper_aborted_twice_is_reaped_once() -> None:
    helper = await Helper.start("tests.stubborn_child", b"", what="test child")
    aborting = asyncio.create_task(helper.abort())
    await asyncio.sleep(0)
    aborting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await aborting
    assert await helper.abort() == helper.process.returncode
    assert helper.process.returncode is not None


def test_a_helper_still_being_stopped_when_its_event_loop_ends_is_reaped() -> None:
    """asyncio.run cancels what is left when its coroutine returns, the reaping included: the
    child is then killed and waited for at once (a warning here would fail the test)."""

    async def leave_it_stopping() -> Helper:
        helper = await Helper.start("tests.stubborn_child", b"", what="test child")
        asyncio.get_running_loop().create_task(helper.stop())  # not awaited: the loop ends first
        await asyncio.sleep(0)
        return helper

    helper = asyncio.run(leave_it_stopping())
    gc.collect()
    assert helper.process._transport.get_extra_info("subprocess").returncode is not None
