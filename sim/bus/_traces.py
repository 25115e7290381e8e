"""The bus's trace batches: many traces per `trace/{shard}` message (a JSON array, in the
order they were added), queued in the bus's outbox once due (sim.protocol.batcher)."""

from __future__ import annotations

import asyncio
import time

from sim.bus._sender import Outgoing, Sender
from sim.protocol.batcher import Batcher

__all__ = ["TraceBatches"]


class TraceBatches:
    """Encoded traces wait here for their batch; `run` queues each batch once it is due."""

    def __init__(self, topic: str, sender: Sender, *, max_items: int, max_bytes: int, linger: float) -> None:
        self._topic = topic
        self._sender = sender
        # each trace is sized with its comma or closing bracket, the opening bracket apart
        self._batcher = Batcher[bytes](max_items=max_items, max_bytes=max_bytes - 1, linger=linger)
        self._waiting = asyncio.Event()

    async def add(self, encoded: bytes) -> None:
        """Add one trace; a batch that is full goes at once, and the waiting ones first when
        this one would take them over the byte bound."""
        size = len(encoded) + 1
        if not self._batcher.fits(size):
            await self.flush()
        self._batcher.add(encoded, size=size, now=time.monotonic())
        if self._batcher.ready(time.monotonic()):
            await self.flush()
        else:
            self._waiting.set()

    async def flush(self) -> None:
        """Queue the traces waiting (nothing when none wait).

        A batch leaves the batcher only once the outbox has room for it: a flush cancelled
        while it waits loses nothing."""
        while self._batcher:
            await self._sender.room_for(self._topic)
            if not self._batcher:  # another flush took them while this one waited
                break
            batch, _ = self._batcher.take(time.monotonic())
            self._sender.enqueue(Outgoing(self._topic, b"[" + b",".join(batch) + b"]", 1, False))

    async def run(self) -> None:
        """Queue each batch once it is due: `linger` seconds after its first trace was added."""
        while True:
            due = self._batcher.due()
            if due is None:
                self._waiting.clear()
                await self._waiting.wait()
            elif due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            else:
                await self.flush()
