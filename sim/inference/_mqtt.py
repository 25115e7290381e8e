"""The MQTT transport: the pool's side (publish, wait for the reply) and the remote worker.

Requests go QoS 1 to `npcsim/{run}/infer/req`; workers consume them through the shared
subscription `$share/{group}/npcsim/{run}/infer/req`, so any number of workers share the
load; replies go to `npcsim/{run}/infer/resp/{shard}` and are matched by correlation id
(the request id). A request whose reply has not come by its deadline (plus a short grace,
so that a worker's own "stale" answer can arrive) gets the fallback with reason "timeout";
a reply that comes later is counted as late and dropped. Malformed payloads are counted,
logged once per kind, and dropped. Requests and replies travel in batches
(`sim.inference._batch`); this module only plugs the batchers into send and receive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import aiomqtt
import msgspec

from sim import topics
from sim.bus import parse_url
from sim.errors import BrokerError, BusError
from sim.inference._batch import Batcher, BatchSender, decode_batch, encode_batch
from sim.inference._pool import Dispatch
from sim.inference._serve import Counters, LogOnce, fallback_result, serve
from sim.inference._types import (
    InferenceRequest,
    InferenceResult,
    PoolConfig,
    PoolStatistics,
    WorkerConfig,
    decode_request,
    decode_result,
)
from sim.inference.backends import Backend, open_backend

__all__ = ["RemoteWorker", "open_mqtt_dispatch"]

log = logging.getLogger(__name__)

_RECONNECT_MAX = 5.0


def _client(url: str, identifier: str, inflight: int) -> aiomqtt.Client:
    host, port = parse_url(url)
    client = aiomqtt.Client(
        host, port, identifier=identifier, protocol=aiomqtt.ProtocolVersion.V5,
        max_inflight_messages=inflight, timeout=10,
    )
    # Up to `inflight` publishes waiting is this client's normal load, not a warning.
    client.pending_calls_threshold = inflight
    return client


async def _listen(
    client: aiomqtt.Client,
    topic: str,
    pending: dict[str, asyncio.Future[InferenceResult]],
    counters: Counters,
    warn: LogOnce,
) -> None:
    try:
        async for message in client.messages:
            payload = message.payload
            if not isinstance(payload, bytes):
                counters.malformed += 1
                warn("result-type", "malformed reply on %s: payload is %s, not bytes", message.topic, type(payload))
                continue
            results, errors = decode_batch(payload, decode_result)
            for exc in errors:
                counters.malformed += 1
                warn("result-decode", "malformed reply on %s dropped: %s", message.topic, exc)
            for result in results:
                future = pending.get(result.id)
                if future is None or future.done():
                    counters.late_replies += 1
                    log.debug("late or unknown reply %s on %s dropped", result.id, message.topic)
                    continue
                future.set_result(result)
    except aiomqtt.MqttError as exc:
        raise BusError(f"lost the broker while listening on {topic}: {exc}") from exc


@contextlib.asynccontextmanager
async def open_mqtt_dispatch(config: PoolConfig, counters: Counters) -> AsyncIterator[Dispatch]:
    """Connect, subscribe to this shard's replies, and hand out the dispatch function."""
    request_topic = topics.infer_request(config.run_id)
    response_topic = topics.infer_response(config.run_id, config.shard)
    pending: dict[str, asyncio.Future[InferenceResult]] = {}
    warn = LogOnce(log)
    identifier = f"npcsim-pool-{config.shard}-{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        try:
            client = await stack.enter_async_context(_client(config.broker, identifier, 2 * config.max_in_flight))
            await client.subscribe(response_topic, qos=1)
        except aiomqtt.MqttError as exc:
            raise BrokerError(f"cannot connect to broker {config.broker} and subscribe to {response_topic}: {exc}") \
                from exc

        def give_up(request: InferenceRequest, reason: str) -> InferenceResult:
            return fallback_result(request, reason, backend=config.backend, model="")

        def answer(requests: list[InferenceRequest], reason: str) -> None:
            for request in requests:
                future = pending.get(request.id)
                if future is not None and not future.done():
                    future.set_result(give_up(request, reason))

        async def send(batch: list[InferenceRequest]) -> None:
            try:
                await client.publish(request_topic, encode_batch(batch), qos=1)
            except aiomqtt.MqttError as exc:
                warn("transport_error", "cannot publish %d requests on %s: %s", len(batch), request_topic, exc)
                answer(batch, "transport_error")

        outbox = BatchSender(Batcher[InferenceRequest](), send, lambda expired: answer(expired, "stale"))

        async def dispatch(request: InferenceRequest) -> InferenceResult:
            if request.shard != config.shard:
                request = msgspec.structs.replace(request, shard=config.shard)
            if request.id in pending:
                raise ValueError(f"inference request id {request.id!r} is already in flight")
            if request.deadline <= time.time():
                counters.dropped_stale += 1
                return give_up(request, "stale")
            future: asyncio.Future[InferenceResult] = asyncio.get_running_loop().create_future()
            pending[request.id] = future
            try:
                outbox.put(request, priority=request.priority, deadline=request.deadline)
                wait = min(config.timeout, request.deadline - time.time()) + config.reply_grace
                try:
                    async with asyncio.timeout(wait):
                        result = await future
                except TimeoutError:
                    warn("timeout", "no reply to request %s of %s within %.2fs", request.id, request.agent_id, wait)
                    return give_up(request, "timeout")
            finally:
                pending.pop(request.id, None)
            if result.fallback_reason == "stale":
                counters.dropped_stale += 1
            return result

        async with asyncio.TaskGroup() as tg:
            listener = tg.create_task(_listen(client, response_topic, pending, counters, warn))
            sender = tg.create_task(outbox.run())
            try:
                yield dispatch
            finally:
                listener.cancel()
                sender.cancel()


class RemoteWorker:
    """A worker that takes requests from the shared subscription until cancelled.

    It reconnects with backoff when the broker goes away; `ready` is set while it is
    subscribed. At most `concurrency` requests are served at once; the rest wait in the
    client's queue, and the deadline check drops those that waited too long.
    """

    def __init__(self, config: WorkerConfig, *, backend: Backend | None = None) -> None:
        self.config = config
        self.name = config.name or f"worker-{uuid.uuid4().hex[:8]}"
        self.ready = asyncio.Event()
        self._backend = backend
        self._counters = Counters()
        self._warn = LogOnce(log)
        parse_url(config.broker)
        self._request_topic = topics.infer_request_shared(config.run_id, config.group)

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
        failures = 0
        while True:
            error: Exception | None = None
            try:
                await self._session(backend)
            except* aiomqtt.MqttError as group:
                error = group.exceptions[0]
            self.ready.clear()
            failures += 1
            delay = min(_RECONNECT_MAX, 0.1 * 2**failures)
            log.warning("worker %s lost the broker %s (%s); reconnecting in %.1fs", self.name, self.config.broker,
                        error, delay)
            await asyncio.sleep(delay)

    async def _session(self, backend: Backend) -> None:
        slots = asyncio.Semaphore(self.config.concurrency)
        async with _client(self.config.broker, self.name, 4 * self.config.concurrency) as client:
            await client.subscribe(self._request_topic, qos=1)

            async def send(batch: list[tuple[str, InferenceResult]]) -> None:
                """One message per shard; a failure ends the session, which reconnects."""
                by_shard: dict[str, list[InferenceResult]] = {}
                for shard, result in batch:
                    by_shard.setdefault(shard, []).append(result)
                for shard, results in by_shard.items():
                    await client.publish(topics.infer_response(self.config.run_id, shard), encode_batch(results), qos=1)

            # Replies never expire here: a late one is the pool's to count (its deadline has a grace).
            replies = BatchSender(Batcher[tuple[str, InferenceResult]](), send, lambda _: None)
            self.ready.set()
            log.info("worker %s serving %s with backend %s", self.name, self._request_topic, backend.name)
            async with asyncio.TaskGroup() as tg:
                sender = tg.create_task(replies.run())
                try:
                    async for message in client.messages:
                        for request in self._requests(message):
                            await slots.acquire()
                            tg.create_task(self._handle(backend, request, slots, replies))
                finally:
                    sender.cancel()

    def _requests(self, message: aiomqtt.Message) -> list[InferenceRequest]:
        """The well-formed requests of a message; each malformed one counted and logged once."""
        c = self._counters
        payload = message.payload
        if not isinstance(payload, bytes):
            c.malformed += 1
            self._warn("request-type", "malformed request on %s: payload is %s", message.topic, type(payload))
            return []
        requests, errors = decode_batch(payload, decode_request)
        for exc in errors:
            c.malformed += 1
            self._warn("request-decode", "malformed request on %s dropped: %s", message.topic, exc)
        return requests

    async def _handle(
        self,
        backend: Backend,
        request: InferenceRequest,
        slots: asyncio.Semaphore,
        replies: BatchSender[tuple[str, InferenceResult]],
    ) -> None:
        """Serve one request; its reply joins the reply batch of the moment it is ready."""
        c = self._counters
        c.in_flight += 1
        c.in_flight_peak = max(c.in_flight_peak, c.in_flight)
        c.requests += 1
        try:
            result = await serve(
                request, backend, time_limit=self.config.timeout, max_line_chars=self.config.max_line_chars,
                counters=c, worker=self.name, warn=self._warn,
            )
        finally:
            c.in_flight -= 1
            slots.release()
        c.count_result(result)
        replies.put((request.shard, result), priority=request.priority, deadline=float("inf"))
