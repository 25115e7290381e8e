"""The tick outbox: a tick's events in, one batch per topic out, sealed for the broker. Sans-I/O.

Agents and players emit events during a tick; `take()` hands them back as one `Batch` per
topic, topics in name order and events in (tick, id) order, so that asyncio's scheduling
never reaches what follows. The shell delivers the batches of topics it routes itself
(its own places and NPCs) straight from these objects, and `seal`s the others: one
msgpack `EventBatch`, signed with the run key (sim.protocol.seal), to publish and keep for
the barrier, whose TickDone lists each topic with its event count.

    outbox = Outbox(shard="0", run_key=key)
    outbox.emit(topics.location_events(run, "forge"), speech)
    for batch in outbox.take():               # Batch(topic, events)
        if routed_here(batch.topic):
            deliver(batch.topic, batch.events)
        else:
            sealed = outbox.seal(tick, batch)  # SealedBatch(topic, payload, events)
            await bus.publish(sealed.topic, sealed.payload)

`flush(tick)` seals every batch: what a shell that routes nothing itself publishes.
"""

from __future__ import annotations

from typing import NamedTuple

from sim.protocol.seal import RunKey, seal
from sim.wire.events import AnyEvent, EventBatch, encode_batch

__all__ = ["Batch", "Outbox", "SealedBatch"]


class Batch(NamedTuple):
    """One topic's events of a tick, sorted by (tick, id)."""

    topic: str
    events: tuple[AnyEvent, ...]


class SealedBatch(NamedTuple):
    """One topic's batch for a tick, ready to publish: its payload and how many events it holds."""

    topic: str
    payload: bytes
    events: int


class Outbox:
    """The events emitted since the last `take`, per topic."""

    def __init__(self, shard: str, run_key: RunKey | None = None) -> None:
        self.shard = shard
        self._run_key = run_key
        self._pending: dict[str, list[AnyEvent]] = {}

    def emit(self, topic: str, event: AnyEvent) -> None:
        """Queue an event for this tick's batch on `topic`."""
        self._pending.setdefault(topic, []).append(event)

    def __len__(self) -> int:
        """Events waiting for the next `take`."""
        return sum(len(events) for events in self._pending.values())

    def take(self) -> list[Batch]:
        """Every waiting event as one batch per topic, in sending order; then empty."""
        pending, self._pending = self._pending, {}
        return [Batch(topic, tuple(sorted(pending[topic], key=lambda e: (e.tick, e.id)))) for topic in sorted(pending)]

    def seal(self, tick: int, batch: Batch) -> SealedBatch:
        """The batch as this shard's `EventBatch` for `tick`, encoded and sealed for its topic."""
        body = encode_batch(EventBatch(shard=self.shard, tick=tick, events=batch.events))
        return SealedBatch(batch.topic, seal(self._run_key, batch.topic, body), len(batch.events))

    def flush(self, tick: int) -> list[SealedBatch]:
        """`take` and `seal` every batch for `tick`."""
        return [self.seal(tick, batch) for batch in self.take()]
