"""Batching for the MQTT inference transport: many requests (or replies) per message.

One MQTT message per request caps the remote path at the broker's per-message cost (about
1,000 round trips/s here, whatever the backend). So requests travel to the workers, and
replies back, in batches: a batch goes out when it holds `MAX_ITEMS`, when its oldest item
has waited `LINGER` seconds, or at once when an item's deadline is nearer than the linger.
Inside a batch, items are ordered by (priority, arrival): the pool's priority order
survives the trip. A worker serves each request of a batch on its own and puts each reply in the reply
batch of the moment it is ready, so one slow request never holds the others' replies.

The batching itself is `sim.protocol.batcher.Batcher` (sans-I/O, shared with the bus's
traces). `BatchSender` is the thin async shell that sleeps until a batch is due and hands
it to a `send` coroutine; while one batch is being sent, the next one fills up, so batches
grow with the load on their own.

`read_batch` is the receiving end, the same at the pool and at a worker: a message's
well-formed items, once its seal is checked; what is malformed is counted and logged once.
The wire format of a batch (a msgpack array of the single messages) is `sim.wire.batch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import msgspec

from sim.inference._counters import Counters, LogOnce
from sim.protocol.batcher import Batcher
from sim.protocol.seal import RunKey, unseal
from sim.wire.batch import decode_batch

__all__ = ["LINGER", "MAX_ITEMS", "BatchSender", "read_batch"]

MAX_ITEMS = 64
"""Items per message: big enough to amortise the per-message cost, small enough that one
message stays a few tens of KB with working memories of 2,000 characters."""

LINGER = 0.002
"""Seconds the first item of a batch may wait for company: short against any deadline."""

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)


class BatchSender(Generic[T]):
    """Runs a `Batcher`: `put` items from any task, `run` sends the batches until cancelled.

    `send(batch)` answers the batch's items itself when the transport fails, or raises to
    end `run` (and so its TaskGroup). `expire(items)` answers items whose deadline passed
    before they could be sent.
    """

    def __init__(
        self,
        batcher: Batcher[T],
        send: Callable[[list[T]], Awaitable[None]],
        expire: Callable[[list[T]], None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._batcher = batcher
        self._send = send
        self._expire = expire
        self._clock = clock
        self._wake = asyncio.Event()
        self.batches = 0
        self.items = 0

    def put(self, item: T, *, priority: int, deadline: float) -> None:
        self._batcher.add(item, priority=priority, deadline=deadline, now=self._clock())
        self._wake.set()

    async def run(self) -> None:
        batcher = self._batcher
        while True:
            self._wake.clear()  # no await until the wait below: a `put` from now on wakes it
            due = batcher.due()
            if due is None:
                await self._wake.wait()
                continue
            wait = due - self._clock()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                continue  # something came, or the batch is due: look again
            batch, expired = batcher.take(self._clock())
            if expired:
                self._expire(expired)
            if batch:
                self.batches += 1
                self.items += len(batch)
                await self._send(batch)


def read_batch(
    payload: object,
    decode: Callable[[bytes], S],
    *,
    topic: str,
    key: RunKey | None,
    what: str,
    counters: Counters,
    warn: LogOnce,
) -> list[S]:
    """The well-formed items of a payload received on `topic`, sealed for it when the run has a key.

    A payload that is not bytes or not correctly sealed, and each malformed element of a
    batch, counts in `counters.malformed` and is logged once per kind; `what` names the
    items ("request", "reply").
    """
    if not isinstance(payload, bytes):
        counters.malformed += 1
        warn(f"{what}-type", "malformed %s on %s: payload is %s, not bytes", what, topic, type(payload))
        return []
    body = unseal(key, topic, payload)
    if body is None:
        counters.malformed += 1
        warn(f"{what}-unsigned", "%s on %s without a valid run-key signature dropped", what, topic)
        return []
    items, errors = decode_batch(body, decode)
    for exc in errors:
        counters.malformed += 1
        warn(f"{what}-decode", "malformed %s on %s dropped: %s", what, topic, exc)
    return items
