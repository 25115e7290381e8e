"""`LocalBroker`: the transport seam in one process, without a broker.

A run executed again (sim.replay) has all its shards in one process and nothing outside to
talk to, so it needs no Mosquitto: each bus gets a `LocalBroker.transport()`, and a message
published by one is handed, in publish order, to every link whose filters match (retained
messages to later subscribers too, as MQTT does). A shared subscription
(`$share/{group}/{filter}`, the remote workers') hands each message to one member of the
group in turn, and never a retained one. The publish returns once the message is queued
for them: there is no network to acknowledge it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import aiomqtt

from sim.mqtt._transport import Session

__all__ = ["LocalBroker"]

_SHARED = "$share/"


class _LocalLink:
    def __init__(self, broker: LocalBroker) -> None:
        self._broker = broker
        self._exact: set[str] = set()
        self._wildcards: list[tuple[str, ...]] = []  # a filter with + or #, by level
        self.shared: dict[tuple[str, str], tuple[str, ...]] = {}  # (group, filter): the filter by level
        self.inbox: asyncio.Queue[tuple[str, bytes, bool]] = asyncio.Queue()

    def matches(self, topic: str) -> bool:
        if topic in self._exact:
            return True
        if not self._wildcards:
            return False
        levels = topic.split("/")
        return any(_matches(levels, f) for f in self._wildcards)

    def add(self, filters: Sequence[str]) -> None:
        for f in filters:
            if f.startswith(_SHARED):
                group, _, inner = f.removeprefix(_SHARED).partition("/")
                aiomqtt.Wildcard(inner)  # refuses a malformed filter, as a broker would
                self.shared[(group, inner)] = tuple(inner.split("/"))
                continue
            aiomqtt.Wildcard(f)
            if "+" in f or "#" in f:
                self._wildcards.append(tuple(f.split("/")))
            else:
                self._exact.add(f)

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        self._broker.publish(topic, payload, retain=retain)

    async def subscribe(self, filters: Sequence[str]) -> None:
        self.add(filters)
        plain = [f for f in filters if not f.startswith(_SHARED)]
        for topic, payload in sorted(self._broker.retained.items()):
            if any(aiomqtt.Topic(topic).matches(f) for f in plain):
                self.inbox.put_nowait((topic, payload, True))

    async def messages(self) -> AsyncIterator[tuple[str, bytes, bool]]:
        while True:
            yield await self.inbox.get()


class _LocalTransport:
    def __init__(self, broker: LocalBroker) -> None:
        self._broker = broker

    async def run(self, session: Session, *, on_lost: Callable[[], None] | None = None) -> None:
        link = _LocalLink(self._broker)
        self._broker.links.append(link)
        try:
            await session(link)
        finally:
            self._broker.links.remove(link)


def _matches(levels: list[str], wildcard: tuple[str, ...]) -> bool:
    """MQTT's rule: `+` is any one level, a last `#` any number of them (none included)."""
    for n, level in enumerate(wildcard):
        if level == "#":
            return True
        if n >= len(levels) or (level != "+" and level != levels[n]):
            return False
    return len(levels) == len(wildcard)


class LocalBroker:
    """Links in one process, connected: `open_bus(config, transport=broker.transport())` each."""

    def __init__(self) -> None:
        self.links: list[_LocalLink] = []
        self.retained: dict[str, bytes] = {}
        self._turns: dict[tuple[str, str], int] = {}  # shared subscription: how many messages it has handed out

    def transport(self) -> _LocalTransport:
        return _LocalTransport(self)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Take one message, as a client's publish does: kept when retained (an empty payload
        clears), then delivered."""
        if retain:
            if payload:
                self.retained[topic] = payload
            else:
                self.retained.pop(topic, None)
        self.deliver(topic, payload)

    def deliver(self, topic: str, payload: bytes) -> None:
        """Hand one message to every subscriber whose filters match it, and to one member of
        each shared subscription that matches."""
        groups: dict[tuple[str, str], list[_LocalLink]] = {}
        levels = topic.split("/")
        for link in self.links:
            if link.matches(topic):
                link.inbox.put_nowait((topic, payload, False))
            for key, wildcard in link.shared.items():
                if _matches(levels, wildcard):
                    groups.setdefault(key, []).append(link)
        for key, members in groups.items():
            turn = self._turns.get(key, 0)
            self._turns[key] = turn + 1
            members[turn % len(members)].inbox.put_nowait((topic, payload, False))
