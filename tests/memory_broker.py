"""An in-memory broker for the transport seam (sim.mqtt.Transport): shards, the run-nonce handshake
and the inference link without Mosquitto.

sim.mqtt's `LocalBroker`, delivering what its links publish to every link whose filters
match (and to one member of a matching shared subscription) in a seeded random order
across topics (as a clustered broker may), each message
after a random delay of up to `max_delay` seconds on the given clock (so a shard that did
not wait for a batch would go on without it). Retained messages are kept and handed to
later subscribers, as MQTT does. Every message published is also recorded, for tests that
look at what a shard sent.

    broker = MemoryBroker(seed=1, clock=clock)
    async with open_bus(config, transport=broker.transport()) as bus: ...
    worker = RemoteWorker(worker_config, transport=broker.transport())
    # and broker.serve() running beside them
"""

from __future__ import annotations

import asyncio
import random

from sim.mqtt import LocalBroker
from sim.shard import Clock

__all__ = ["MemoryBroker"]


class MemoryBroker(LocalBroker):
    def __init__(self, seed: int, clock: Clock, *, max_delay: float = 0.02) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.clock = clock
        self.max_delay = max_delay
        self.queue: list[tuple[str, bytes]] = []
        self.published: list[tuple[str, bytes]] = []
        self._ready = asyncio.Event()
        self._never = asyncio.Event()

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Take a message for delivery by `serve`, as a client's publish does."""
        self.published.append((topic, payload))
        if retain:
            self.retained[topic] = payload
        self.queue.append((topic, payload))
        self._ready.set()

    accept = publish

    async def serve(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self.queue:
                topic, payload = self.queue.pop(self.rng.randrange(len(self.queue)))
                await self.clock.wait(self._never, self.rng.random() * self.max_delay)
                self.deliver(topic, payload)
