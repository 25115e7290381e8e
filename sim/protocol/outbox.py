"""The tick outbox: a tick's events in, one sealed msgpack batch per topic out. Sans-I/O.

Agents and players emit events during a tick; `flush(tick)` makes one `EventBatch` per
topic of them, topics in name order and events in (tick, id) order, so that asyncio's
scheduling never reaches the bytes, and seals each payload with the run key
(sim.protocol.seal). The shell publishes the batches and keeps them for the barrier,
whose TickDone lists each topic with its event count.

    outbox = Outbox(shard="0", run_key=key)
    outbox.emit(topics.location_events(run, "forge"), speech)
    for batch in outbox.flush(tick):          # SealedBatch(topic, payload, events)
        await bus.publish(batch.topic, batch.payload)
"""

from __future__ import annotations

from typing import NamedTuple

from sim.protocol.seal import RunKey, seal
from sim.wire.events import AnyEvent, EventBatch, encode_batch

__all__ = ["Outbox", "SealedBatch"]


class SealedBatch(NamedTuple):
    """One topic's batch for a tick, ready to publish: its payload and how many events it holds."""

    topic: str
    payload: bytes
    events: int


class Outbox:
    """The events emitted since the last `flush`, per topic."""

    def __init__(self, shard: str, run_key: RunKey | None = None) -> None:
        self.shard = shard
        self._run_key = run_key
        self._pending: dict[str, list[AnyEvent]] = {}

    def emit(self, topic: str, event: AnyEvent) -> None:
        """Queue an event for this tick's batch on `topic`."""
        self._pending.setdefault(topic, []).append(event)

    def __len__(self) -> int:
        """Events waiting for the next `flush`."""
        return sum(len(events) for events in self._pending.values())

    def flush(self, tick: int) -> list[SealedBatch]:
        """Every waiting event as one sealed batch per topic for `tick`, in sending order; then empty."""
        pending, self._pending = self._pending, {}
        batches = []
        for topic in sorted(pending):
            events = tuple(sorted(pending[topic], key=lambda e: (e.tick, e.id)))
            body = encode_batch(EventBatch(shard=self.shard, tick=tick, events=events))
            batches.append(SealedBatch(topic, seal(self._run_key, topic, body), len(events)))
        return batches
