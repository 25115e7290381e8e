"""Each model server's adaptive limit: cut where requests queue at the server, and reaching the
pool whatever serves its requests: in its own process, in its worker process, or remote
workers over MQTT (a fake OpenAI-compatible server on loopback that says it is overloaded or
serves a few requests at a time, real HTTP, a real Mosquitto)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiomqtt
import msgspec
import pytest

from sim.inference import PoolConfig, RemoteWorker, WorkerConfig, open_pool
from sim.inference._counters import MAX_WORKERS, Counters
from sim.wire import topics
from sim.wire.inference import (
    MAX_SERVERS,
    WORKER_OFFLINE,
    WorkerLimits,
    decode_worker_limits,
    encode_worker_limits,
)
from tests.fake_openai import FakeOpenAI, open_fake_openai
from tests.helpers import MosquittoProcess, eventually
from tests.inference_helpers import make_request, running

CEILING = 16
CUT = 11  # 16 x 0.7 once: the three 429s are the retries of one request, one round


def overloaded_options(fake: FakeOpenAI) -> dict[str, Any]:
    fake.script = ["429"] * 3
    return {"base_url": fake.base_url, "retries": 3}


@pytest.mark.parametrize(("capacity", "delay_s", "queued"), [(2, 0.2, True), (CEILING, 1.0, False)])
async def test_the_limit_is_cut_where_requests_wait_at_the_server(capacity: int, delay_s: float, queued: bool,
                                                                  ) -> None:
    # a server that takes all at once serves slowly enough that a loaded machine's own
    # overhead (a request's latency beyond the server's time) stays far below it
    async with open_fake_openai() as fake:
        fake.capacity, fake.delay_s = capacity, delay_s
        fake.timings = {"prompt_ms": delay_s * 1000, "predicted_ms": 0.0}  # its own time: true, as it serves
        config = PoolConfig(backend="openai", options={"base_url": fake.base_url}, concurrency=CEILING,
                            transport="inprocess", timeout=30.0)  # type: ignore[arg-type]
        async with open_pool(config) as pool:
            results = await asyncio.gather(*(pool.infer(make_request(n, agent=f"npc{n}"))
                                             for n in range(3 * CEILING)))
            assert not any(r.fallback for r in results)
            limit = pool.statistics().server_limits[fake.base_url]
            assert (limit < CEILING) is queued, limit


@pytest.mark.parametrize("transport", ["inprocess", "process"])
async def test_a_pool_reports_the_limit_its_server_settled_on(transport: str) -> None:
    async with open_fake_openai() as fake:
        config = PoolConfig(backend="openai", options=overloaded_options(fake), concurrency=CEILING,
                            transport=transport, timeout=20.0)  # type: ignore[arg-type]
        async with open_pool(config) as pool:
            assert pool.statistics().server_limits == {}  # none heard of before a result
            result = await pool.infer(make_request(0))
            assert not result.fallback, result.fallback_reason
            assert pool.statistics().server_limits == {fake.base_url: CUT}


@pytest.mark.mosquitto
async def test_remote_workers_limits_are_summed_and_a_dead_ones_forgotten(mosquitto: MosquittoProcess) -> None:
    run = "limits"
    async with open_fake_openai() as fake:
        options = overloaded_options(fake)
        workers = [
            RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name=f"w{n}", backend="openai",
                                      options=options, concurrency=CEILING))
            for n in range(2)
        ]
        config = PoolConfig(transport="mqtt", broker=mosquitto.address, run_id=run, max_in_flight=4)
        async with running(*workers), open_pool(config) as pool:
            served: set[str] = set()
            for n in range(40):  # the shared subscription hands requests round the workers
                served.add((await pool.infer(make_request(n, agent=f"npc{n}"))).worker)
                if len(served) == 2:
                    break
            assert served == {"w0", "w1"}
            assert pool.statistics().server_limits == {fake.base_url: CUT + CEILING}  # one was overloaded
            assert sorted(w.statistics().server_limits[fake.base_url] for w in workers) == [CUT, CEILING]

            await _say_offline(mosquitto, topics.infer_worker(run, "w0"))
            await eventually(lambda: sum(pool.statistics().server_limits.values()) < CUT + CEILING,
                             what="the pool forgetting w0's limit")
            assert pool.statistics().server_limits in ({fake.base_url: CUT}, {fake.base_url: CEILING})


@pytest.mark.mosquitto
async def test_a_stopped_worker_says_it_is_offline_and_its_limit_is_forgotten(mosquitto: MosquittoProcess) -> None:
    run = "stopped"
    async with open_fake_openai() as fake:
        workers = [
            RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name=f"w{n}", backend="openai",
                                      options={"base_url": fake.base_url}, concurrency=CEILING))
            for n in range(2)
        ]
        config = PoolConfig(transport="mqtt", broker=mosquitto.address, run_id=run, max_in_flight=4)
        async with open_pool(config) as pool, asyncio.TaskGroup() as group:
            tasks = [group.create_task(w.run()) for w in workers]
            await eventually(lambda: all(w.ready.is_set() for w in workers), what="both workers subscribed")
            served: set[str] = set()
            for n in range(40):
                served.add((await pool.infer(make_request(n, agent=f"npc{n}"))).worker)
                if len(served) == 2:
                    break
            assert pool.statistics().server_limits == {fake.base_url: 2 * CEILING}
            tasks[0].cancel()  # a clean stop (Ctrl-C): the broker sends no last will for it
            await eventually(lambda: pool.statistics().server_limits == {fake.base_url: CEILING},
                             what="the pool forgetting the stopped worker's limit")
            result = await pool.infer(make_request(99, agent="npc99"))
            assert result.worker == "w1" and not result.fallback
            tasks[1].cancel()


async def _say_offline(mosquitto: MosquittoProcess, topic: str) -> None:
    """What the broker says for a worker that died (its last will), said here by hand."""
    async with aiomqtt.Client(mosquitto.address.host, mosquitto.port) as client:
        await client.publish(topic, WORKER_OFFLINE, qos=1)


def test_a_limit_below_one_or_too_many_servers_is_a_malformed_worker_status() -> None:
    for limits in ({"http://a/v1": 0}, {f"http://s{n}/v1": 1 for n in range(MAX_SERVERS + 1)}):
        with pytest.raises(msgspec.ValidationError):
            decode_worker_limits(msgspec.msgpack.encode({"limits": limits}))
    said = encode_worker_limits(WorkerLimits(limits={"http://a/v1": 3}))
    assert decode_worker_limits(said).limits == {"http://a/v1": 3}


def test_limits_of_more_workers_than_a_pool_keeps_count_for_nothing() -> None:
    counters = Counters()
    for n in range(MAX_WORKERS + 5):
        counters.hear_limits(f"w{n}", {"http://a/v1": 1})
    assert counters.snapshot().server_limits == {"http://a/v1": MAX_WORKERS}
    counters.hear_limits("w0", {"http://a/v1": 2})  # a worker kept still speaks
    assert counters.snapshot().server_limits == {"http://a/v1": MAX_WORKERS + 1}
