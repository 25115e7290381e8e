"""The remote worker: the far end of the MQTT transport, run by `npcsim worker`.

It takes requests from the shared subscription `$share/{group}/npcsim/{run}/infer/req`, so
any number of workers share one run's load, serves each on its backend as an in-process
pool would (`sim.inference._serve`), and answers on `npcsim/{run}/infer/resp/{shard}` of
the shard that asked. Requests arrive and replies leave in batches (`sim.inference._batch`);
with a run key every payload is sealed (`sim.protocol.seal`): the worker's key has no run
nonce, so it serves every instance of the run and seals each reply for the instance whose
request it answers (a shard takes only replies sealed for its own). After a broker restart
it subscribes again; the pool's link re-sends what was lost. Its MQTT 5 last will says
"offline" on `npcsim/{run}/infer/worker/{name}` (sealed with the run key, not retained): a
worker killed mid-inference is noticed by every pool at once, and they send the requests it
held again (sim.inference._link). A worker stopped (cancelled) says the same itself before it
disconnects, since a broker sends no will for a clean disconnect. On the same topic it says
its model servers' adaptive limits (`WorkerLimits`) before a reply batch, when they changed
and once a second while it serves (a pool that joined since hears them), never on every reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from sim.errors import BrokerError
from sim.inference._batch import LINGER, MAX_ITEMS, BatchSender, read_batch
from sim.inference._counters import Counters, LogOnce, PoolStatistics
from sim.inference._pool_config import WorkerConfig
from sim.inference._serve import serve
from sim.inference.backends import Backend, open_backend
from sim.mqtt import ClientOptions, LastWill, Link, MqttTransport, Transport
from sim.output import FactGuard, load_fact_guard
from sim.protocol.batcher import Batcher
from sim.protocol.seal import RunKey, seal, sealed_nonce
from sim.wire import topics
from sim.wire.batch import encode_batch
from sim.wire.inference import (
    WORKER_OFFLINE,
    InferenceRequest,
    InferenceResult,
    WorkerLimits,
    decode_request,
    encode_worker_limits,
)

__all__ = ["RemoteWorker"]

log = logging.getLogger(__name__)

_ReplyTo = tuple[str, bytes | None]  # the asking shard, and the run nonce its request was sealed with
OFFLINE_SAY_S = 2.0  # how long a stopping worker tries to say it is offline
LIMITS_SAY_S = 1.0  # a serving worker says its limits again this often: a pool that joined since hears them


class _SaidLimits:
    """The servers' limits a worker said last on its connection, and when."""

    def __init__(self) -> None:
        self.limits: dict[str, int] = {}
        self.at = -LIMITS_SAY_S

    def due(self, limits: dict[str, int], now: float) -> bool:
        """Whether `limits` are to be said now (and, if so, they count as said)."""
        if not limits or (limits == self.limits and now - self.at < LIMITS_SAY_S):
            return False
        self.limits, self.at = limits, now
        return True


class RemoteWorker:
    """A worker that takes requests from the shared subscription until cancelled.

    It reconnects per its reconnect policy (forever by default) when the broker goes away;
    `ready` is set while it is subscribed. At most `concurrency` requests are served at
    once; the rest wait in the connection's queue, and the deadline check drops those that
    waited too long. Its output check uses `fact_guard`, or the one `config.fact_guard` names:
    the same guard as the run's pool, which judges the replies again. `transport` defaults
    to MQTT to `config.broker`, with the worker's last will.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        backend: Backend | None = None,
        fact_guard: FactGuard | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.config = config
        self.guard = fact_guard if fact_guard is not None else load_fact_guard(config.fact_guard)
        self.name = config.name or f"worker-{uuid.uuid4().hex[:8]}"
        self.ready = asyncio.Event()
        self._backend = backend
        self._counters = Counters()
        self._warn = LogOnce(log)
        self._request_topic = topics.infer_request_shared(config.run_id, config.group)
        self._will = self._last_will()
        self._transport = transport or MqttTransport(
            config.broker, name=f"worker {self.name}", policy=config.reconnect,
            client=ClientOptions(identifier=self.name, max_inflight=4 * config.concurrency, will=self._will),
        )

    def statistics(self) -> PoolStatistics:
        return self._counters.snapshot()

    async def run(self) -> None:
        if self._backend is not None:
            await self._reconnecting(self._backend)
            return
        async with open_backend(
            self.config.backend, self.config.options, self.config.concurrency, self.config.timeout
        ) as backend:
            await self._reconnecting(backend)

    async def _reconnecting(self, backend: Backend) -> None:
        async def session(link: Link) -> None:
            await self._session(link, backend)

        await self._transport.run(session, on_lost=self.ready.clear)

    async def _session(self, link: Link, backend: Backend) -> None:
        slots = asyncio.Semaphore(self.config.concurrency)
        await link.subscribe([self._request_topic])

        said = _SaidLimits()  # a new connection says them again: a pool may have forgotten them meanwhile

        async def send(batch: list[tuple[_ReplyTo, InferenceResult]]) -> None:
            """One message per shard (and run instance); a lost connection ends the session, which reconnects.
            The servers' limits go first when they changed, or now and then (`LIMITS_SAY_S`)."""
            limits = self._counters.server_limits()
            if said.due(limits, time.monotonic()):
                topic = self._will.topic
                body = encode_worker_limits(WorkerLimits(limits=limits))
                await link.publish(topic, seal(self.config.run_key, topic, body), qos=1, retain=False)
            by_shard: dict[_ReplyTo, list[InferenceResult]] = {}
            for reply_to, result in batch:
                by_shard.setdefault(reply_to, []).append(result)
            for (shard, nonce), results in by_shard.items():
                topic = topics.infer_response(self.config.run_id, shard)
                try:
                    await link.publish(topic, seal(self._key_for(nonce), topic, encode_batch(results)), qos=1,
                                       retain=False)
                except BrokerError as exc:
                    self._warn("reply-lost", "%d replies lost with the connection (%s); the pool re-sends or "
                               "times them out", len(results), exc)
                    raise

        serving: set[tuple[str, str]] = set()  # (shard, request id): a pool's re-send of one of them waits for it
        # Replies never expire here: a late one is the pool's to count (its deadline has a grace).
        batcher = Batcher[tuple[_ReplyTo, InferenceResult]](max_items=MAX_ITEMS, linger=LINGER)
        replies = BatchSender(batcher, send, lambda _: None)
        self.ready.set()
        log.info("worker %s serving %s with backend %s", self.name, self._request_topic, backend.name)
        try:
            async with asyncio.TaskGroup() as tg:
                sender = tg.create_task(replies.run())
                try:
                    async for _, payload, _ in link.messages():
                        nonce = sealed_nonce(payload)
                        for request in self._requests(payload):
                            if (request.shard, request.id) in serving:
                                log.debug("request %s is being served here already: its re-send dropped",
                                          request.id)
                                continue
                            await slots.acquire()
                            serving.add((request.shard, request.id))
                            tg.create_task(self._handle(backend, request, (request.shard, nonce), slots, replies,
                                                        serving))
                finally:
                    sender.cancel()
        except asyncio.CancelledError:
            await self._say_offline(link)
            raise

    async def _handle(
        self,
        backend: Backend,
        request: InferenceRequest,
        reply_to: _ReplyTo,
        slots: asyncio.Semaphore,
        replies: BatchSender[tuple[_ReplyTo, InferenceResult]],
        serving: set[tuple[str, str]],
    ) -> None:
        """Serve one request; its reply joins the reply batch of the moment it is ready."""
        c = self._counters
        c.in_flight += 1
        c.in_flight_peak = max(c.in_flight_peak, c.in_flight)
        c.requests += 1
        try:
            result = await serve(
                request, backend, time_limit=self.config.timeout, rules=self.config.rules,
                counters=c, worker=self.name, warn=self._warn, guard=self.guard,
            )
        finally:
            c.in_flight -= 1
            slots.release()
            serving.discard((request.shard, request.id))
        c.count_result(result)
        replies.put((reply_to, result), priority=request.priority, deadline=float("inf"))

    async def _say_offline(self, link: Link) -> None:
        """A stop: the last will said by the worker itself, so that every pool forgets its limits
        and sends the requests it held again now, not when their replies are overdue."""
        with contextlib.suppress(BrokerError, TimeoutError):
            async with asyncio.timeout(OFFLINE_SAY_S):
                await link.publish(self._will.topic, self._will.payload, qos=1, retain=self._will.retain)
                log.info("worker %s stopped: said offline", self.name)

    def _last_will(self) -> LastWill:
        """What the broker says for this worker when its connection dies: "offline", sealed (no nonce:
        the worker serves every instance of the run)."""
        topic = topics.infer_worker(self.config.run_id, self.name)
        return LastWill(topic, seal(self.config.run_key, topic, WORKER_OFFLINE), retain=False)

    def _key_for(self, nonce: bytes | None) -> RunKey | None:
        """The key a reply is sealed with: the run key, for the run instance that asked."""
        key = self.config.run_key
        return None if key is None else key if nonce is None else key.for_run(nonce)

    def _requests(self, payload: bytes) -> list[InferenceRequest]:
        """The well-formed, sealed requests of a message whose shard can name a reply topic."""
        request_topic = topics.infer_request(self.config.run_id)
        decoded = read_batch(
            payload, decode_request, topic=request_topic,
            key=self.config.run_key, what="request", counters=self._counters, warn=self._warn,
        )
        requests = []
        for request in decoded:
            try:
                topics.check_segment("shard", request.shard)
            except ValueError as exc:
                self._counters.malformed += 1
                self._warn("request-shard", "request on %s dropped: %s", request_topic, exc)
                continue
            requests.append(request)
        return requests
