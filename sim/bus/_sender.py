"""The bus's QoS 1 outbox and the task that publishes it, in order, over the current link.

    sender = Sender(size=10_000, window=64, reconnect=policy, broker=address.url, stats=stats)
    await sender.publish(Outgoing(topic, payload, qos=1, retain=False))   # queued
    sender.connect(link) / sender.lost()                                  # from the connection
    await sender.run()                                                    # the publishing task

A publish waits in the bounded outbox while the broker is away; when the outbox is full
the caller waits while connected (backpressure) and gets OutboxFullError during an outage:
a QoS 1 message is never dropped silently. Up to `window` publishes wait for their
acknowledgement at once; those a lost connection held are sent again, first and in their
original order.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
from typing import NamedTuple

from sim.backoff import Backoff, BackoffPolicy
from sim.errors import BrokerError, BusError, OutboxFullError, single_error
from sim.mqtt import Link
from sim.protocol.router import BusStats

__all__ = ["Outgoing", "Sender"]

log = logging.getLogger(__name__)


class Outgoing(NamedTuple):
    """One message for the broker, as the bus's caller gave it."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


class Sender:
    """The outbox, the publishes in flight and those to retry; `run` publishes them."""

    def __init__(self, *, size: int, window: int, reconnect: BackoffPolicy, broker: str, stats: BusStats) -> None:
        self._size = size
        self._window = window
        self._broker = broker
        self._stats = stats
        self._outbox: collections.deque[Outgoing] = collections.deque()
        self._ready = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._inflight = 0
        self._retry: list[tuple[int, Outgoing]] = []  # failed publishes, by the order they were sent in
        self._publishing: set[asyncio.Task[None]] = set()  # publishes waiting for their acknowledgement
        self._unacknowledged: dict[int, Outgoing] = {}  # those publishes' messages, by the order they were sent in
        self._failed = False
        self._backoff = Backoff(reconnect)
        self.connected = asyncio.Event()
        self.link: Link | None = None
        """The connection publishes go on; None while there is none."""

    def connect(self, link: Link) -> None:
        """A connection is up: publish on it."""
        self.link = link
        self.connected.set()
        self._ready.set()

    def lost(self) -> None:
        """The connection went: what it held unacknowledged is sent again on the next one."""
        self.connected.clear()
        self.link = None
        self._space.set()
        for task in self._publishing:  # their acknowledgements went with the connection: sent again
            task.cancel()

    async def publish(self, item: Outgoing) -> None:
        """Queue a message; OutboxFullError when the outbox is full during an outage."""
        await self.room_for(item.topic)
        self.enqueue(item)

    async def room_for(self, topic: str) -> None:
        """Wait until the outbox has room (while connected); OutboxFullError when it cannot."""
        while len(self._outbox) >= self._size:
            if not self.connected.is_set():
                raise OutboxFullError(
                    f"outbox full ({self._size} messages) while the broker {self._broker} is unreachable; "
                    f"cannot queue a message for {topic}"
                )
            self._space.clear()
            await self._space.wait()

    def enqueue(self, item: Outgoing) -> None:
        """Queue a message without waiting (after `room_for`)."""
        self._outbox.append(item)
        self._ready.set()

    def waiting(self) -> list[Outgoing]:
        """Every message the broker has not acknowledged yet: in flight, to be retried, then queued."""
        return [*(item for _, item in sorted(self._unacknowledged.items())),
                *(item for _, item in sorted(self._retry)), *self._outbox]

    def unsent(self) -> int:
        """How many messages are queued, in flight or to be retried."""
        return len(self._outbox) + self._inflight + len(self._retry)

    async def wait_sent(self) -> None:
        """Wait until every message is acknowledged (callers bound it with a timeout)."""
        while self._outbox or self._inflight or self._retry:
            self._space.clear()
            await self._space.wait()

    async def run(self) -> None:
        """Publish the outbox in order, with up to `window` publishes unacknowledged.

        A publish is started as soon as the window has room (not in chunks whose slowest
        acknowledgement holds back the next): QoS 1 needs the broker's PUBACK, not a wait
        for each one before sending the next. paho hands publishes to the socket in the
        order they were started, so the broker sees the outbox order. A failed publish
        (the connection went) is retried first, in its original order, after a backoff;
        the publishes still waiting for an acknowledgement when a connection is lost are
        cancelled and retried too (a publish has no timeout of its own: a dead connection
        is found by the keepalive, and a timer per publish cost more than the publish).
        """
        window = asyncio.Semaphore(self._window)
        order = itertools.count()
        try:
            async with asyncio.TaskGroup() as group:
                while True:
                    await self._ready.wait()
                    await self.connected.wait()
                    if self._failed:
                        self._failed = False
                        await asyncio.sleep(self._backoff.next())
                        continue
                    link = self.link
                    if link is None or not (self._retry or self._outbox):
                        self._ready.clear()
                        continue
                    await window.acquire()
                    if self.link is not link:  # the connection went while the window was full
                        window.release()
                        continue
                    item = heapq.heappop(self._retry)[1] if self._retry else self._outbox.popleft()
                    self._inflight += 1
                    self._space.set()
                    seq = next(order)
                    self._unacknowledged[seq] = item
                    task = group.create_task(self._publish_one(link, seq, item, window))
                    self._publishing.add(task)
                    task.add_done_callback(self._publishing.discard)
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None

    async def _publish_one(self, link: Link, seq: int, item: Outgoing, window: asyncio.Semaphore) -> None:
        topic, payload, qos, retain = item
        try:
            await link.publish(topic, payload, qos=qos, retain=retain)
        except asyncio.CancelledError:
            self._unacknowledged.pop(seq, None)
            heapq.heappush(self._retry, (seq, item))  # the connection went (`lost`), or the bus closes
            raise
        except BrokerError:
            if not self._failed:
                log.warning("publishing failed (the connection went); retrying after a backoff")
            self._unacknowledged.pop(seq, None)
            heapq.heappush(self._retry, (seq, item))
            self._failed = True
        except Exception as exc:
            raise BusError(f"publishing to {topic} failed: {exc!r}") from exc
        else:
            self._unacknowledged.pop(seq, None)
            self._stats.messages_out += 1
            self._backoff.reset()
        finally:
            self._inflight -= 1
            window.release()
            self._space.set()
            self._ready.set()
