"""One fuzz schedule: hostile payloads sent to every topic a live village run reads, then the checks.

A fresh Mosquitto from broker-config/ per run (nothing retained from another), the village
run in this process (`sim.shard.run`) paced at `TICK_MS`, and one client publishing the
seed's payloads, each to a topic drawn from every topic the run subscribes to: players'
input (under good and hostile player ids), the game system's topics, world state,
presence, a place's events, an NPC's inbox and the shard's barrier. The checks:
- the run ends at its last tick, however it was fed;
- every payload is accounted for: refused (`bus.refused`) or dropped as malformed
  (`bus.malformed`), by the run's own counters, one each;
- its audit (ids, ticks, prompts, lines) equals the same run's without any payload: nothing
  refused reached a memory, a prompt or a line; and no outside input was journaled.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt

from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader, read_arrivals
from sim.wire import topics
from tests.fuzz.payloads import Payload, draw_payloads
from tests.helpers import VILLAGE, MosquittoProcess, eventually, require_mosquitto

__all__ = ["Outcome", "clean_audit", "fuzz_run"]

RUN = "fuzz"
TICKS = 120
TICK_MS = 25
PLAYERS = ("visitor", "p.1", "<|im_start|>", "a" * 300, "game", "shard", "\u202eevil", "")


def targets() -> list[tuple[str, str]]:
    """(kind, topic) for every topic the run reads."""
    found = [("player input", topics.player_input(RUN, p) if p else f"npcsim/{RUN}/player//input") for p in PLAYERS]
    found += [("presence", f"npcsim/{RUN}/player/{p}/presence") for p in PLAYERS[:3]]
    found += [("game event", topics.game_event(RUN)), ("game fact", topics.game_fact(RUN)),
              ("world state", topics.world_state(RUN)), ("place events", topics.location_events(RUN, "inn")),
              ("inbox", topics.agent_inbox(RUN, "innkeeper")), ("barrier", topics.barrier(RUN, "0"))]
    return found


@dataclass
class Outcome:
    sent: collections.Counter[str] = field(default_factory=collections.Counter)  # by payload kind
    topics: collections.Counter[str] = field(default_factory=collections.Counter)  # by topic kind
    accounted: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _config(broker: MosquittoProcess, db: Path) -> RunConfig:
    return RunConfig(scenario=str(VILLAGE), run_id=RUN, until_tick=TICKS, tick_ms=TICK_MS,
                     broker=BrokerConfig(url=broker.url), record=RecordConfig(db=str(db)))


def _accounted(stats: RunStats) -> int:
    bus = stats.bus
    return 0 if bus is None else sum(bus.malformed.values()) + sum(bus.refused.values())


def audit_digest(db: Path) -> tuple[int, str]:
    """How many records, and a digest of their ids, ticks, prompts and lines in id order."""
    with open_reader(db) as reader:
        rows = sorted((r.id, r.tick, r.prompt_sha256, r.line) for r in reader.audit_records())
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


async def clean_audit(directory: Path) -> tuple[int, str]:
    """The village's audit without a single hostile payload."""
    broker = MosquittoProcess(require_mosquitto(), directory)
    broker.start()
    try:
        await run(_config(broker, directory / "clean.db"))
    finally:
        broker.stop()
    return audit_digest(directory / "clean.db")


async def fuzz_run(seed: int, count: int, directory: Path, clean: tuple[int, str]) -> Outcome:
    rng = random.Random(seed)
    payloads = draw_payloads(rng, count)
    where = targets()
    outcome = Outcome()
    db = directory / f"fuzz-{seed}.db"
    broker = MosquittoProcess(require_mosquitto(), directory)
    broker.start()
    stats = RunStats()
    try:
        async with (aiomqtt.Client("127.0.0.1", broker.port, max_queued_outgoing_messages=None) as client,
                    asyncio.TaskGroup() as group):
            job = group.create_task(run(_config(broker, db), stats=stats))
            await eventually(lambda: stats.tick >= 1, what="the run under way", within=60)
            before = _accounted(stats)
            for payload in payloads:
                await _send(client, rng, where, payload, outcome)
            await eventually(lambda: _accounted(stats) - before >= len(payloads),
                             what="every payload refused or dropped", within=60)
            outcome.accounted = _accounted(stats) - before
            ended = await job
    finally:
        broker.stop()
    _check(outcome, ended, db, clean, len(payloads))
    return outcome


async def _send(client: aiomqtt.Client, rng: random.Random, where: list[tuple[str, str]], payload: Payload,
                outcome: Outcome) -> None:
    kind, topic = rng.choice(where)
    await client.publish(topic, payload.body, qos=1)
    outcome.sent[payload.kind] += 1
    outcome.topics[kind] += 1


def _check(outcome: Outcome, ended: RunStats, db: Path, clean: tuple[int, str], sent: int) -> None:
    if ended.tick != TICKS - 1:
        outcome.problems.append(f"the run ended at tick {ended.tick}, not {TICKS - 1}")
    if outcome.accounted != sent:
        outcome.problems.append(f"{sent} payloads sent, {outcome.accounted} refused or dropped")
    if read_arrivals(db, None):
        outcome.problems.append("an outside input was journaled")
    digest = audit_digest(db)
    if digest != clean:
        outcome.problems.append(f"the audit differs from the clean run's: {digest} against {clean}")
