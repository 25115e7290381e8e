"""A flood of forged Joins on an open broker makes a bounded number of re-sends.

On a broker with neither login nor run key anyone can send a `Join` in a peer's name,
each with a fresh session, so naming Joins stops replays but not forgeries. The re-sends
they ask for are limited per peer on the shard's clock (sim.protocol.admission.Resends):
3,000 forged Joins in shard 1's name, sent over a second and a half while a two-shard run
of the village goes on, make shard 0 re-send at most once per second, the run ends at its
last tick on both shards, and the folded Joins are counted and logged once per interval.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiomqtt
import pytest

from sim.protocol.admission import Resends
from sim.shard import BrokerConfig, RunConfig, RunStats, run
from sim.wire import topics
from sim.wire.barrier import Join, TickDone, decode_barrier, encode_barrier
from tests.helpers import VILLAGE, MosquittoProcess, elapse, eventually

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(300)]

RUN = "flood"
TICKS = 160
FORGED = 3000


def test_resends_are_one_per_peer_per_interval_and_the_rest_folded() -> None:
    resends = Resends(interval=1.0)
    resends.request("1", 5, now=0.0)
    assert resends.due(0.0) == 5  # the first is served at once
    for n in range(1000):
        resends.request("1", 9 - n % 3, now=0.1)
    assert resends.due(0.5) is None and resends.waiting()  # folded, not dropped
    assert resends.due(1.0) == 7  # the lowest tick any of them asked for
    assert resends.due(5.0) is None and not resends.waiting()
    resends.request("2", 3, now=1.2)  # per peer: shard 2 is not held by shard 1's flood
    assert resends.due(1.2) == 3
    assert (resends.resends, resends.folded) == (3, 1000)
    assert resends.report(1.2) == {"1": 1000} and resends.report(1.3) == {}


async def test_a_flood_of_forged_joins_makes_a_bounded_number_of_resends(
    mosquitto: MosquittoProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sim.shard")
    configs = [RunConfig(
        scenario=VILLAGE, run_id=RUN, ticks=TICKS, tick_ms=25, shard=f"{i}/2", broker=BrokerConfig(url=mosquitto.url),
    )
               for i in range(2)]
    stats = [RunStats() for _ in configs]
    ready = [asyncio.Event() for _ in configs]
    done_by_tick: dict[int, int] = {}  # shard 0's TickDones on the wire, by tick: > 1 is a re-send

    async def watch(client: aiomqtt.Client) -> None:
        async for message in client.messages:
            decoded = decode_barrier(bytes(message.payload))  # type: ignore[arg-type]
            if isinstance(decoded, TickDone):
                done_by_tick[decoded.tick] = done_by_tick.get(decoded.tick, 0) + 1

    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client, asyncio.TaskGroup() as group:
        await client.subscribe(topics.barrier(RUN, "0"), qos=1)
        watcher = group.create_task(watch(client))
        started = time.monotonic()
        jobs = [group.create_task(run(c, stats=s, on_ready=lambda _, e=e: e.set()))  # type: ignore[misc]
                for c, s, e in zip(configs, stats, ready, strict=True)]
        await asyncio.gather(*(e.wait() for e in ready))
        peer = topics.barrier(RUN, "1")
        for n in range(FORGED):
            forged = Join(shard="1", shards=2, tick=0, session=f"forged-{n}", seq=0)
            await client.publish(peer, encode_barrier(forged), qos=0)
            if n % 100 == 99:
                await elapse(0.05)  # the subject: the flood lasts a second and a half: many ticks
        await asyncio.gather(*jobs)
        elapsed = time.monotonic() - started
        await eventually(lambda: TICKS - 1 in done_by_tick, what="shard 0's last TickDone at the watcher")
        watcher.cancel()
    assert [s.tick for s in stats] == [TICKS - 1, TICKS - 1]  # the run went to its end on both shards
    zero = stats[0]
    bound = int(elapsed / 1.0) + 2  # one per second of the run, and the legitimate Join at each start
    assert 1 <= zero.resends <= bound, f"{zero.resends} re-sends in {elapsed:.1f} s"
    assert zero.resends_folded + zero.resends >= FORGED, "forged Joins were neither served nor counted"
    resent = sum(n - 1 for n in done_by_tick.values())
    # a re-send carries what is kept: the TickDones of the tick waited at and of the two before it
    assert resent <= 3 * bound, f"{resent} TickDones re-sent on the wire"
    lines = [r for r in caplog.records if "Join requests folded" in r.getMessage()]
    assert 1 <= len(lines) <= bound, f"{len(lines)} log lines for the folded Joins"
    print(f"\n{FORGED} forged Joins: {zero.resends} re-sends, {zero.resends_folded} folded, {resent} TickDones "
          f"re-sent, {len(lines)} log lines, in {elapsed:.1f} s")
