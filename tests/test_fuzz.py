"""The fuzz harness's short schedule (the long one: `make fuzz SEEDS=50`), and its payloads
checked sans-I/O: every kind refused on every topic, without an exception."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sim.protocol.bounds import InputBounds
from sim.protocol.received import InputRefused
from sim.protocol.router import Router
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
        for kind, topic in targets():
            got = router.receive(topic, payload.body)
            if kind in ("player input", "presence", "game event", "game fact", "world state"):
                # Taken only when it names an NPC or place the run lacks: the shard refuses it then.
                assert got is None or isinstance(got, InputRefused) or "nobody" in repr(got), (payload.kind, topic)
            else:
                assert got is None, (payload.kind, topic, got)


@pytest.mark.mosquitto
@pytest.mark.timeout(300)
async def test_a_short_schedule_leaves_the_run_alive_and_its_audit_unchanged(tmp_path: Path) -> None:
    clean = await clean_audit(tmp_path)
    for seed in (1, 2):
        outcome = await fuzz_run(seed, 40, tmp_path, clean)
        assert outcome.ok, outcome.problems
        assert sum(outcome.sent.values()) == outcome.accounted == 40
