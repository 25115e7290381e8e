"""Remote workers through a real Mosquitto: sharing, a killed worker, stale and malformed requests."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from pathlib import Path

import aiomqtt
import httpx
import msgspec
import pytest

from sim.inference import (
    InferenceResult,
    PoolConfig,
    RemoteWorker,
    WorkerConfig,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
    open_pool,
)
from sim.inference.backends.scripted import scripted_reply
from sim.output import clean_line
from sim.protocol.seal import RunKey, new_nonce
from sim.wire import topics
from sim.wire.batch import decode_batch, encode_batch
from sim.wire.inference import WORKER_OFFLINE
from tests.helpers import MosquittoProcess, ended, eventually, free_port, start_npcsim
from tests.inference_helpers import make_request, running

pytestmark = pytest.mark.mosquitto

def pool_config(broker: MosquittoProcess, run: str, **kw: object) -> PoolConfig:
    return PoolConfig(transport="mqtt", broker=broker.address, run_id=run, **kw)  # type: ignore[arg-type]


async def test_two_workers_share_the_load(mosquitto: MosquittoProcess) -> None:
    run = "share"
    workers = [
        RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name=f"w{i}", concurrency=2,
                                  options={"delay_ms": 20}))
        for i in range(2)
    ]
    async with running(*workers), open_pool(pool_config(mosquitto, run, max_in_flight=4)) as pool:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(pool.infer(make_request(n, agent=f"npc{n}"))) for n in range(20)]
        stats = pool.statistics()
    results = [t.result() for t in tasks]
    assert all(not r.fallback for r in results)
    sent = [make_request(n, agent=f"npc{n}") for n in range(20)]
    expected = [clean_line(scripted_reply(q.memory), q.agent_id, 200) for q in sent]
    assert [r.line for r in results] == expected  # the memory crossed the wire
    assert {r.worker for r in results} == {"w0", "w1"}
    assert {r.id for r in results} == {f"req-npc{n}-{n}" for n in range(20)}
    assert all(w.statistics().completed > 0 for w in workers)
    assert stats.completed == 20 and stats.in_flight_peak <= 4


async def _start_worker_process(
    broker: MosquittoProcess, run: str, name: str, delay_ms: int, *extra: str
) -> asyncio.subprocess.Process:
    proc = await start_npcsim(
        "worker", "--broker", broker.url, "--run", run, "--name", name,
        "--set", f"inference.backend_options.delay_ms={delay_ms}",
        "--concurrency", "2", *extra,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(15):
        line = await proc.stdout.readline()
        if line.startswith(b"metrics:"):  # with --metrics-port, its address comes first
            line = await proc.stdout.readline()
    assert b"ready" in line, line
    return proc


async def _in_flight(metrics: httpx.AsyncClient) -> float:
    """The worker process's `npcsim_inferences_in_flight`, read from its metrics endpoint."""
    text = (await metrics.get("/metrics")).text
    return float(next(line.split()[1] for line in text.splitlines()
                      if line.startswith("npcsim_inferences_in_flight ")))


async def test_worker_killed_mid_request_gives_a_timeout_fallback_and_the_pool_goes_on(
    mosquitto: MosquittoProcess,
) -> None:
    run = "kill"
    port = free_port()
    doomed = await _start_worker_process(mosquitto, run, "doomed", 10_000, "--metrics-port", str(port))
    try:
        async with (
            open_pool(pool_config(mosquitto, run, reply_grace=0.1)) as pool,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as metrics,
        ):
            async with asyncio.TaskGroup() as tg:
                pending = tg.create_task(pool.infer(make_request(1, deadline_in=3.0)))
                await eventually(lambda: _in_flight(metrics), what="the worker holding the request",
                                 within=2.5)  # it sleeps on it
                doomed.send_signal(signal.SIGKILL)
            lost = pending.result()
            assert lost.fallback and lost.fallback_reason == "timeout"
            assert lost.line in ("The forge needs me; ask again later.", "Hmm. Not now, friend.")
            survivor = RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name="survivor"))
            async with running(survivor):
                after = await pool.infer(make_request(2))
            assert not after.fallback and after.worker == "survivor"
            assert pool.statistics().fallbacks == {"timeout": 1}
    finally:
        if doomed.returncode is None:
            doomed.kill()
        await doomed.wait()


def _audit_set(results: list[InferenceResult]) -> set[tuple[str, tuple[str, ...], str]]:
    """What the run's audit keeps of each inference: its id, every attempt's prompt digest, its line."""
    return {(r.id, tuple(hashlib.sha256(a.prompt.encode()).hexdigest() for a in r.attempts), r.line)
            for r in results}


@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "run-key"])
async def test_a_worker_killed_holding_requests_is_noticed_and_another_answers_them(
    mosquitto: MosquittoProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture, keyed: bool
) -> None:
    """Issue 24: kill -9 of one of two workers while it holds requests. Its last will makes the
    pool re-send them to the other at once: no timeout fallback (the inference timeout is 30 s and
    the deadlines 30 s: a fallback would be "timeout"), each answered once, the calm run's audit."""
    run = f"will-{keyed}"
    key = RunKey.generate() if keyed else None
    extra: list[str] = []
    if key is not None:
        key_file = tmp_path / "run.key"
        key_file.write_bytes(key.secret)
        key_file.chmod(0o600)
        extra = ["--run-key-file", str(key_file)]
    pool_key = None if key is None else key.for_run(new_nonce())
    requests = [make_request(n, agent=f"npc{n}", deadline_in=30.0) for n in range(12)]
    def survivor() -> RemoteWorker:
        return RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name="survivor", run_key=key,
                                         options={"delay_ms": 20}))

    async with running(survivor()), open_pool(pool_config(mosquitto, run, run_key=pool_key, max_in_flight=12)) as pool:
        calm = [await pool.infer(r) for r in requests]  # the calm run: the survivor alone
    port = free_port()
    doomed = await _start_worker_process(mosquitto, run, "doomed", 60_000, "--metrics-port", str(port), *extra)
    try:
        async with (
            running(survivor()),
            open_pool(pool_config(mosquitto, run, run_key=pool_key, max_in_flight=12)) as pool,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as metrics,
        ):
            again = [msgspec.structs.replace(r, deadline=time.time() + 30.0) for r in requests]
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(pool.infer(r)) for r in again]
                await eventually(lambda: _in_flight(metrics), what="the doomed worker holding requests", within=10)
                doomed.send_signal(signal.SIGKILL)
            stats = pool.statistics()
    finally:
        if doomed.returncode is None:
            doomed.kill()
        await doomed.wait()
    results = [t.result() for t in tasks]
    assert stats.fallbacks == {} and not any(r.fallback for r in results)
    assert [r.id for r in results] == [r.id for r in requests] and stats.completed == len(requests)
    assert {r.worker for r in results} == {"survivor"}  # the doomed one never answered
    assert _audit_set(results) == _audit_set(calm)
    assert stats.resent >= 1
    gone = [r for r in caplog.records if "worker doomed is gone" in r.getMessage()]
    assert len(gone) == 1, [r.getMessage() for r in gone]


async def test_a_forged_will_costs_at_most_a_re_send(mosquitto: MosquittoProcess) -> None:
    """With a run key an unsigned "offline" is counted and changes nothing; without one, a flood of
    forged wills re-sends the waiting requests at most once per RESEND_GAP, each answered once."""
    run = "forged-will"
    key = RunKey.generate()
    pool_key = key.for_run(new_nonce())
    worker = RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name="slow", run_key=key,
                                       options={"delay_ms": 1500}))
    forged_topic = topics.infer_worker(run, "slow")
    async with (
        running(worker),
        open_pool(pool_config(mosquitto, run, run_key=pool_key)) as pool,
        aiomqtt.Client("127.0.0.1", mosquitto.port) as forger,
    ):
        pending = asyncio.create_task(pool.infer(make_request(1)))
        await eventually(lambda: worker.statistics().in_flight == 1, what="the worker serving")
        for _ in range(50):
            await forger.publish(forged_topic, WORKER_OFFLINE, qos=1)
        result = await pending
        stats = pool.statistics()
    assert not result.fallback and result.worker == "slow"
    assert stats.resent == 0 and stats.malformed >= 50
    assert worker.statistics().completed == 1
    unkeyed = RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run + "-open", name="slow",
                                        options={"delay_ms": 1500}))
    async with (
        running(unkeyed),
        open_pool(pool_config(mosquitto, run + "-open")) as pool,
        aiomqtt.Client("127.0.0.1", mosquitto.port) as forger,
    ):
        pending = asyncio.create_task(pool.infer(make_request(1)))
        await eventually(lambda: unkeyed.statistics().in_flight == 1, what="the worker serving")
        for _ in range(200):
            await forger.publish(topics.infer_worker(run + "-open", "slow"), WORKER_OFFLINE, qos=1)
        result = await pending
        stats = pool.statistics()
    assert not result.fallback and result.worker == "slow" and stats.completed == 1
    assert 1 <= stats.resent <= 8  # re-send rounds 0.25 s apart at least over the 1.5 s: not one per will
    assert unkeyed.statistics().completed == 1  # the worker does not serve a copy of what it is serving


async def test_worker_process_exits_0_on_sigterm(mosquitto: MosquittoProcess) -> None:
    proc = await _start_worker_process(mosquitto, "term", "polite", delay_ms=0)
    try:
        async with open_pool(pool_config(mosquitto, "term")) as pool:
            result = await pool.infer(make_request())
        assert not result.fallback and result.worker == "polite"
    finally:
        end = await ended(proc, within=10, terminate=True)
    assert end.code == 0
    assert "stopped: 1 served" in end.out


async def test_worker_drops_stale_and_malformed_requests(mosquitto: MosquittoProcess) -> None:
    run = "stale"
    worker = RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name="w"))
    async with running(worker), aiomqtt.Client("127.0.0.1", mosquitto.port,
                                                protocol=aiomqtt.ProtocolVersion.V5) as client:
        await client.subscribe(topics.infer_response(run, "0"), qos=1)
        await client.publish(topics.infer_request(run), b"\x93not a request", qos=1)
        await client.publish(topics.infer_request(run), b"\xc1 is never valid msgpack", qos=1)
        stale = make_request(1, deadline_in=-5.0)
        await client.publish(topics.infer_request(run), encode_request(stale), qos=1)
        fresh = make_request(2)
        await client.publish(topics.infer_request(run), encode_request(fresh), qos=1)
        in_batch = make_request(3)  # a batch with one malformed element: the other is served
        await client.publish(topics.infer_request(run), encode_batch([in_batch, fresh.memory]), qos=1)
        replies = {}
        async with asyncio.timeout(10):
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                results, errors = decode_batch(message.payload, decode_result)
                assert not errors
                replies.update((result.id, result) for result in results)
                if len(replies) == 3:
                    break
    assert replies[stale.id].fallback and replies[stale.id].fallback_reason == "stale"
    assert not replies[fresh.id].fallback and not replies[in_batch.id].fallback
    stats = worker.statistics()
    assert stats.malformed == 3 and stats.dropped_stale == 1 and stats.completed == 3


async def test_no_worker_means_a_timeout_fallback(mosquitto: MosquittoProcess) -> None:
    async with open_pool(pool_config(mosquitto, "empty", reply_grace=0.0)) as pool:
        result = await pool.infer(make_request(deadline_in=0.3))
        stale = await pool.infer(make_request(2, deadline_in=-1.0))
    assert result.fallback and result.fallback_reason == "timeout"
    assert stale.fallback_reason == "stale" and pool.statistics().dropped_stale == 1


async def test_an_unreachable_broker_is_a_broker_error() -> None:
    from sim.errors import BrokerError
    from sim.mqtt import BrokerAddress, ReconnectPolicy

    config = PoolConfig(transport="mqtt", broker=BrokerAddress(port=free_port()),
                        reconnect=ReconnectPolicy(initial=0.01, patience=0.2))
    with pytest.raises(BrokerError, match="no MQTT connection"):
        async with open_pool(config):
            pass


async def _forge_replies(port: int, run: str, line: str, answered: asyncio.Event) -> None:
    """An outsider on an anonymous broker: read each request, answer first in a worker's place."""
    async with aiomqtt.Client("127.0.0.1", port, protocol=aiomqtt.ProtocolVersion.V5) as forger:
        await forger.subscribe(topics.infer_request(run), qos=1)
        answered.set()
        async for message in forger.messages:
            assert isinstance(message.payload, bytes)
            body = message.payload
            requests, _ = decode_batch(body[52:] if body.startswith(b"NPK2") else body, decode_request)  # signed
            short = line.split(".")[0] + "."  # a clean line, unless the raw text is held to it
            for request in requests:  # is not secret
                forged = InferenceResult(id=request.id, agent_id=request.agent_id, tick=request.tick,
                                         line=line if len(line) < 200 and "FORGED" not in line else short,
                                         raw_response=line, backend="scripted", model="", worker="forger")
                await forger.publish(topics.infer_response(run, request.shard), encode_result(forged), qos=1)


@pytest.mark.parametrize(
    "forged",
    ["FORGED " * 435, "The old bridge is not broken.", "*grins* As an AI I cannot say.", "Fine. FORGED " * 20],
    ids=["3046 characters", "negates a canonical fact", "uncleaned", "raw text that is not the line"],
)
async def test_a_forged_reply_is_held_to_the_pools_output_checks(mosquitto: MosquittoProcess, forged: str) -> None:
    run = "forge"
    listening = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        forger = tg.create_task(_forge_replies(mosquitto.port, run, forged, listening))
        await listening.wait()
        async with open_pool(pool_config(mosquitto, run)) as pool:
            result = await pool.infer(make_request(1))
            stats = pool.statistics()
        forger.cancel()
    assert result.fallback and result.fallback_reason == "rejected"
    assert "FORGED" not in result.line and "not broken" not in result.line and result.raw_response is None
    assert stats.rejected_outputs == 1


async def test_with_a_run_key_only_signed_replies_count(mosquitto: MosquittoProcess) -> None:
    run = "keyed"
    key = RunKey.generate()
    listening = asyncio.Event()
    # The honest worker is slow, so the forger always answers first.
    worker = RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name="honest", run_key=key,
                                       options={"delay_ms": 500}))
    async with asyncio.TaskGroup() as tg:
        forger = tg.create_task(_forge_replies(mosquitto.port, run, "A plausible forged line.", listening))
        await listening.wait()
        async with running(worker), open_pool(pool_config(mosquitto, run, run_key=key)) as pool:
            result = await pool.infer(make_request(1))
            stats = pool.statistics()
        forger.cancel()
    assert not result.fallback and result.worker == "honest" and "forged" not in result.line
    assert stats.malformed >= 1  # the unsigned forged reply


async def test_the_pool_and_the_worker_ride_out_a_broker_restart(
    mosquitto: MosquittoProcess, caplog: pytest.LogCaptureFixture
) -> None:
    run = "restart"
    worker = RemoteWorker(WorkerConfig(broker=mosquitto.address, run_id=run, name="w",
                                       options={"delay_ms": 300}))
    async with running(worker), open_pool(pool_config(mosquitto, run)) as pool:
        assert not (await pool.infer(make_request(0))).fallback
        async with asyncio.TaskGroup() as tg:
            waiting = [tg.create_task(pool.infer(make_request(n, deadline_in=60))) for n in range(1, 5)]
            await eventually(lambda: worker.statistics().in_flight == 4,
                             what="the worker holding the four requests", within=10)  # it sleeps on them
            mosquitto.stop()
            await eventually(lambda: not worker.ready.is_set() and "inference pool of shard 0: MQTT connection"
                             in caplog.text, what="both ends knowing the broker is gone, the requests unanswered",
                             within=10)
            mosquitto.start()
        results = [t.result() for t in waiting]
        after = await pool.infer(make_request(9))
    assert [r.fallback for r in results] == [False] * 4, [r.fallback_reason for r in results]
    assert not after.fallback
    assert "is back" in caplog.text
