"""An in-memory broker for the bus's transport seam (sim.bus.Transport): shards without Mosquitto.

It delivers what the buses publish to every bus whose filters match, in a seeded random
order across topics (as a clustered broker may), each message after a random delay of up
to `max_delay` seconds on the given clock (so a shard that did not wait for a batch would
go on without it). Retained messages are kept and handed to later subscribers, as MQTT does.
Every message published is also recorded, for tests that look at what a shard sent.

    broker = MemoryBroker(seed=1, clock=clock)
    async with open_bus(config, transport=broker.transport()) as bus: ...
    # and broker.serve() running beside it
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import aiomqtt

from sim.bus import Link
from sim.shard import Clock

__all__ = ["MemoryBroker"]


class _MemoryLink:
    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker
        self.filters: list[str] = []
        self.inbox: asyncio.Queue[tuple[str, bytes, bool]] = asyncio.Queue()

    def matches(self, topic: str) -> bool:
        return any(aiomqtt.Topic(topic).matches(f) for f in self.filters)

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        self._broker.accept(topic, payload, retain=retain)

    async def subscribe(self, filters: Sequence[str]) -> None:
        self.filters.extend(filters)
        for topic, payload in sorted(self._broker.retained.items()):
            if any(aiomqtt.Topic(topic).matches(f) for f in filters):
                self.inbox.put_nowait((topic, payload, True))

    async def messages(self) -> AsyncIterator[tuple[str, bytes, bool]]:
        while True:
            yield await self.inbox.get()


class _MemoryTransport:
    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker

    async def run(self, session: Callable[[Link], Awaitable[None]], *, on_lost: Callable[[], None]) -> None:
        link = _MemoryLink(self._broker)
        self._broker.links.append(link)
        try:
            await session(link)
        finally:
            self._broker.links.remove(link)


class MemoryBroker:
    def __init__(self, seed: int, clock: Clock, *, max_delay: float = 0.02) -> None:
        self.rng = random.Random(seed)
        self.clock = clock
        self.max_delay = max_delay
        self.links: list[_MemoryLink] = []
        self.queue: list[tuple[str, bytes]] = []
        self.retained: dict[str, bytes] = {}
        self.published: list[tuple[str, bytes]] = []
        self._ready = asyncio.Event()
        self._never = asyncio.Event()

    def transport(self) -> _MemoryTransport:
        return _MemoryTransport(self)

    def accept(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Take a message for delivery, as a client's publish does."""
        self.published.append((topic, payload))
        if retain:
            self.retained[topic] = payload
        self.queue.append((topic, payload))
        self._ready.set()

    async def serve(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self.queue:
                topic, payload = self.queue.pop(self.rng.randrange(len(self.queue)))
                await self.clock.wait(self._never, self.rng.random() * self.max_delay)
                for link in self.links:
                    if link.matches(topic):
                        link.inbox.put_nowait((topic, payload, False))
