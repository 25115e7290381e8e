"""The fuzz harness's short schedule (the long one: `make fuzz SEEDS=50`), and its payloads
checked sans-I/O: every kind refused on every topic, one count each, without an exception."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sim.inference import PoolConfig, RemoteWorker, WorkerConfig
from sim.inference._counters import Counters
from sim.inference._link import _PoolLink
from sim.mqtt import BrokerAddress
from sim.output import load_fact_guard
from sim.protocol.bounds import InputBounds
from sim.protocol.received import InputRefused
from sim.protocol.router import Router
from sim.view.model import RunModel
from sim.wire import topics
from tests.fuzz.payloads import KINDS, draw_payloads
from tests.fuzz.runner import RUN, clean_audit, fuzz_run, targets


def test_every_kind_is_drawn_and_every_seed_draws_the_same() -> None:
    drawn = draw_payloads(random.Random(5), len(KINDS))
    assert sorted(p.kind for p in drawn) == sorted(KINDS)
    assert draw_payloads(random.Random(5), 30) == draw_payloads(random.Random(5), 30)


@pytest.mark.parametrize("seed", range(20))
def test_every_payload_is_refused_on_every_topic_the_router_reads(seed: int) -> None:
    router = Router(RUN, "0", mailbox_size=10, seen_events=100, bounds=InputBounds())
    for channel in ("player-input", "world-state", "game-event", "game-fact", "presence"):
        router.route(channel)
    router.route_barrier()
    router.route_location(topics.location_events(RUN, "inn"), "inn", 1)
    router.route_inboxes({"innkeeper"})
    for payload in draw_payloads(random.Random(seed), 40):
        for target in targets():
            if "run" not in target.readers:
                continue
            got = router.receive(target.topic, payload.body)
            if target.kind in ("player input", "presence", "game event", "game fact", "world state"):
                # Taken only when it names an NPC or place the run lacks: the shard refuses it then.
                assert got is None or isinstance(got, InputRefused) or "nobody" in repr(got), (payload.kind, target)
            else:
                assert got is None, (payload.kind, target, got)


@pytest.mark.parametrize("seed", range(10))
def test_every_payload_is_counted_once_by_the_worker_the_pool_and_the_view(seed: int) -> None:
    """What the live schedule checks, for every kind on every topic: one count by each reader."""
    worker = RemoteWorker(WorkerConfig(broker=BrokerAddress(), run_id=RUN))
    pool = _PoolLink(PoolConfig(transport="mqtt", run_id=RUN), Counters(), load_fact_guard(""))
    for payload in draw_payloads(random.Random(seed), 40):
        for target in targets():
            counted = []
            if "worker" in target.readers:
                before = worker.statistics().malformed
                assert worker._requests(payload.body) == [], payload.kind
                counted.append(worker.statistics().malformed - before)
            if "pool" in target.readers:
                before = pool.counters.malformed + pool.counters.late_replies
                if target.kind == "worker status":
                    pool.worker_said(target.topic, payload.body)
                else:
                    pool.receive(target.topic, payload.body)
                counted.append(pool.counters.malformed + pool.counters.late_replies - before)
            if "view" in target.readers:
                view = RunModel(RUN)
                view.feed(target.topic, payload.body, 0.0)
                counted.append(view.health.malformed)
                assert view.lines() == [] and view.npcs == {} and view.world == {}, (payload.kind, target)
            assert all(c == 1 for c in counted), (payload.kind, target, counted)


@pytest.mark.mosquitto
@pytest.mark.timeout(300)
async def test_a_short_schedule_leaves_the_run_its_worker_and_its_view_alive_and_the_audit_unchanged(
    tmp_path: Path,
) -> None:
    clean = await clean_audit(tmp_path)
    for seed in (1, 2):  # a remote worker serves the odd seed's inferences
        outcome = await fuzz_run(seed, 40, tmp_path, clean)
        assert outcome.ok, outcome.problems
        assert outcome.remote == (seed == 1)
        assert sum(outcome.sent.values()) == 40 and outcome.counted == outcome.expected
        assert outcome.requests["POST /api/say"] == 40
