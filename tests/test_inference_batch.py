"""Batching on the inference transport: the sans-I/O batcher, the wire format, and a real broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import aiomqtt
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.inference import (
    InferenceRequest,
    PoolConfig,
    Priority,
    RemoteWorker,
    Reply,
    WorkerConfig,
    decode_request,
    encode_request,
    open_pool,
)
from sim.inference._batch import BatchSender
from sim.memory import WorkingMemory
from sim.protocol.batcher import Batcher
from sim.wire import topics
from sim.wire.batch import decode_batch, encode_batch
from tests.helpers import MosquittoProcess
from tests.inference_helpers import make_request, running

# --- the batcher, without I/O ---------------------------------------------------------------


def test_a_batch_goes_when_full_or_after_the_linger() -> None:
    b: Batcher[str] = Batcher(max_items=3, linger=0.01)
    assert b.due() is None and not b.ready(0.0)
    b.add("a", priority=1, deadline=100.0, now=1.0)
    b.add("b", priority=1, deadline=100.0, now=1.005)
    assert b.due() == pytest.approx(1.01) and not b.ready(1.009) and b.ready(1.01)
    b.add("c", priority=1, deadline=100.0, now=1.006)
    assert b.ready(1.006)
    assert b.take(1.006) == (["a", "b", "c"], [])
    assert len(b) == 0 and b.due() is None


def test_a_near_deadline_goes_at_once_and_a_passed_one_is_never_sent() -> None:
    b: Batcher[str] = Batcher(max_items=10, linger=0.5)
    b.add("tight", priority=1, deadline=1.2, now=1.0)
    assert b.ready(1.0)
    b.add("gone", priority=0, deadline=1.0, now=1.0)
    assert b.take(1.0) == (["tight"], ["gone"])


def test_priority_order_inside_a_batch_and_the_rest_is_due_at_once() -> None:
    b: Batcher[str] = Batcher(max_items=3, linger=1.0)
    for name, priority in [("amb1", 2), ("npc1", 1), ("player1", 0), ("amb2", 2), ("player2", 0)]:
        b.add(name, priority=priority, deadline=100.0, now=0.0)
    assert b.take(0.0) == (["player1", "player2", "npc1"], [])
    assert b.ready(0.0)
    assert b.take(0.0) == (["amb1", "amb2"], [])


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_items"):
        Batcher(max_items=0)
    with pytest.raises(ValueError, match="linger"):
        Batcher(linger=-1.0)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.floats(0.0, 2.0), st.floats(0.0, 0.5)),
        st.tuples(st.just("take"), st.floats(0.0, 0.5)),
    ),
    max_size=80,
)


@given(ops, st.integers(1, 5), st.floats(0.0, 0.3))
def test_every_item_leaves_once_in_order_within_bounds(
    operations: list[tuple[object, ...]], max_items: int, linger: float
) -> None:
    b: Batcher[int] = Batcher(max_items=max_items, linger=linger)
    now, added, out = 0.0, {}, []
    for op in operations:
        if op[0] == "add":
            _, priority, deadline_in, step = op
            now += float(step)  # type: ignore[arg-type]
            n = len(added)
            added[n] = (int(priority), float(now) + float(deadline_in))  # type: ignore[call-overload,arg-type]
            b.add(n, priority=added[n][0], deadline=added[n][1], now=now)
        else:
            now += float(op[1])  # type: ignore[arg-type]
            batch, expired = b.take(now)
            assert len(batch) <= max_items
            assert [added[i][0] for i in batch] == sorted(added[i][0] for i in batch)
            assert all(added[i][1] > now for i in batch) and all(added[i][1] <= now for i in expired)
            out += batch + expired
    while len(b):
        batch, expired = b.take(now)
        out += batch + expired
    assert sorted(out) == list(added)


# --- the wire format ------------------------------------------------------------------------


def test_a_malformed_element_costs_only_itself() -> None:
    good = [make_request(n) for n in range(3)]
    payload = msgspec.msgpack.encode([msgspec.msgpack.decode(encode_request(good[0])), {"id": 1}, "junk",
                                      msgspec.msgpack.decode(encode_request(good[2]))])
    requests, errors = decode_batch(payload, decode_request)
    assert [r.id for r in requests] == [good[0].id, good[2].id] and len(errors) == 2
    assert decode_batch(encode_batch(good), decode_request) == (good, [])
    assert decode_batch(encode_request(good[1]), decode_request) == ([good[1]], [])  # a single message
    for junk in (b"", b"\xc1", b"\x93abc trailing", b"\xa3abc", b"\x90", b"\xdc\x00\x00"):  # empty arrays too
        requests, errors = decode_batch(junk, decode_request)
        assert requests == [] and len(errors) == 1


# --- the async shell ------------------------------------------------------------------------


async def test_the_next_batch_fills_while_one_is_being_sent() -> None:
    sent: list[list[int]] = []
    first_sent, release, all_sent = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def send(batch: list[int]) -> None:
        sent.append(batch)
        first_sent.set()
        if sum(map(len, sent)) == 7:
            all_sent.set()
        if len(sent) == 1:
            await release.wait()

    sender = BatchSender(Batcher[int](max_items=4, linger=0.0), send, lambda _: None)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(sender.run())
        sender.put(0, priority=1, deadline=time.time() + 60)
        async with asyncio.timeout(30):
            await first_sent.wait()
        for n in range(1, 7):
            sender.put(n, priority=1, deadline=time.time() + 60)
        release.set()
        async with asyncio.timeout(30):
            await all_sent.wait()
        task.cancel()
    assert sent == [[0], [1, 2, 3, 4], [5, 6]]
    assert (sender.batches, sender.items) == (3, 7)


async def test_items_that_expire_waiting_are_answered_not_sent() -> None:
    sent: list[list[str]] = []
    expired: list[str] = []
    done = asyncio.Event()

    async def send(batch: list[str]) -> None:
        sent.append(batch)
        done.set()

    sender = BatchSender(Batcher[str](max_items=8, linger=0.05), send, expired.extend)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(sender.run())
        sender.put("late", priority=1, deadline=time.time() - 1)
        sender.put("fine", priority=1, deadline=time.time() + 60)
        async with asyncio.timeout(30):
            await done.wait()
        task.cancel()
    assert sent == [["fine"]] and expired == ["late"]


# --- through a real Mosquitto ---------------------------------------------------------------


class SlowForOne:
    """Answers at once, except for one agent, which waits until released."""

    name = "test"
    model = "m"
    prompt_form = "text"
    prompt_prefix = ""

    def __init__(self, slow_agent: str) -> None:
        self.slow_agent = slow_agent
        self.release = asyncio.Event()

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None) -> Reply:
        if memory.agent_id == self.slow_agent:
            await self.release.wait()
        return Reply(text=f"{memory.agent_id} speaks.", model=self.model)


pytestmark = pytest.mark.mosquitto


async def test_requests_travel_in_batches_and_a_slow_one_holds_no_other_reply(
    mosquitto: MosquittoProcess,
) -> None:
    run = "batch"
    backend = SlowForOne("slow")
    worker = RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name="w", concurrency=32), backend=backend)
    seen: list[list[InferenceRequest]] = []
    config = PoolConfig(transport="mqtt", broker=mosquitto.address, run_id=run, max_in_flight=64, reply_grace=0.0)
    requests = [make_request(0, agent="slow", priority=Priority.AMBIENT, deadline_in=60)]
    requests += [make_request(n, agent=f"npc{n}", priority=Priority(n % 3), deadline_in=60) for n in range(1, 40)]

    async def sniff(ready: asyncio.Event) -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port, protocol=aiomqtt.ProtocolVersion.V5) as client:
            await client.subscribe(topics.infer_request(run), qos=1)
            ready.set()
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                seen.append(decode_batch(message.payload, decode_request)[0])

    async with running(worker), open_pool(config) as pool, asyncio.TaskGroup() as tg:
        ready = asyncio.Event()
        sniffer = tg.create_task(sniff(ready))
        await ready.wait()
        tasks = [tg.create_task(pool.infer(r)) for r in requests]
        async with asyncio.timeout(30):
            fast = await asyncio.gather(*tasks[1:])
        assert not tasks[0].done(), "the slow request should still be at the backend"
        backend.release.set()
        async with asyncio.timeout(30):
            slow = await tasks[0]
        sniffer.cancel()
    assert [r.line for r in fast] == [f"npc{n} speaks." for n in range(1, 40)]
    assert not slow.fallback and slow.line == "slow speaks."
    assert sorted(r.id for batch in seen for r in batch) == sorted(r.id for r in requests)
    assert len(seen) < len(requests), f"{len(seen)} messages for {len(requests)} requests"
    for batch in seen:
        assert [r.priority for r in batch] == sorted(r.priority for r in batch)
    assert worker.statistics().completed == 40
