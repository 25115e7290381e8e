"""The MQTT transport: the pool's side (publish, wait for the reply) and the remote worker.

Requests go QoS 1 to `npcsim/{run}/infer/req`; workers consume them through the shared
subscription `$share/{group}/npcsim/{run}/infer/req`, so any number of workers share the
load; replies go to `npcsim/{run}/infer/resp/{shard}` and are matched by correlation id
(the request id). A request whose reply has not come by its deadline (plus a short grace,
so that a worker's own "stale" answer can arrive) gets the fallback with reason "timeout";
a reply that comes later is counted as late and dropped. Malformed payloads are counted,
logged once per kind, and dropped. Requests and replies travel in batches
(`sim.inference._batch`); this module only plugs the batchers into send and receive.

Both sides connect through `sim.mqtt` and ride out a broker restart: the pool re-sends,
on the new connection, every request still waiting for its reply, and again with backoff
until it is answered, since workers come back on their own schedule (a worker's second
answer is counted as late); the worker subscribes again. A reply is trusted no more than
a model: `sim.inference._replies` holds it to what the pool could have produced itself, so
a client that answers in a worker's place cannot make an NPC say what the checks would
refuse, nor put text of its own into the audit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiomqtt
import msgspec

from sim.errors import single_error
from sim.inference._batch import Batcher, BatchSender, decode_batch, encode_batch
from sim.inference._pool import Dispatch
from sim.inference._replies import reply_problem
from sim.inference._serve import Counters, LogOnce, fallback_result, serve
from sim.inference._types import (
    InferenceRequest,
    InferenceResult,
    PoolConfig,
    PoolStatistics,
    WorkerConfig,
    decode_request,
    decode_result,
    encode_request,
)
from sim.inference.backends import Backend, open_backend
from sim.mqtt import open_client, stay_connected
from sim.wire import topics

__all__ = ["RemoteWorker", "open_mqtt_dispatch"]

log = logging.getLogger(__name__)

@dataclass
class _Waiting:
    request: InferenceRequest
    future: asyncio.Future[InferenceResult]
    sent_on: int = 0  # the connection it was last published on (0: none yet)
    outage: bool = False  # it was waiting through a lost connection: re-sent until answered


class _PoolLink:
    """The pool's connection: requests waiting for replies survive a reconnect and are re-sent."""

    def __init__(self, config: PoolConfig, counters: Counters) -> None:
        self.config = config
        self.counters = counters
        self.warn = LogOnce(log)
        self.request_topic = topics.infer_request(config.run_id)
        self.response_topic = topics.infer_response(config.run_id, config.shard)
        self.identifier = f"npcsim-pool-{config.shard}-{uuid.uuid4().hex[:8]}"
        self.waiting: dict[str, _Waiting] = {}
        self.connected = asyncio.Event()
        self.client: aiomqtt.Client | None = None
        self.connection = 0
        self.outbox = BatchSender(Batcher[_Waiting](), self.send_batch, self.expire)

    def new_client(self) -> aiomqtt.Client:
        return open_client(self.config.broker, identifier=self.identifier, max_inflight=2 * self.config.max_in_flight)

    def lost(self) -> None:
        self.connected.clear()
        self.client = None

    async def session(self, client: aiomqtt.Client) -> None:
        await client.subscribe(self.response_topic, qos=1)
        self.connection += 1
        self.client = client
        self.connected.set()
        resend = [w for w in self.waiting.values() if w.sent_on != self.connection and not w.future.done()]
        if resend and self.connection > 1:
            log.warning("re-sending %d inference requests after the reconnect", len(resend))
        for entry in resend:
            entry.outage = self.connection > 1
            await self.send(client, entry)
        async with asyncio.TaskGroup() as tg:
            if self.connection > 1:
                tg.create_task(self.resend_after_outage(client))
            async for message in client.messages:
                self.receive(message)

    async def resend_after_outage(self, client: aiomqtt.Client) -> None:
        """Re-send requests that waited through an outage, with backoff, until each is answered.

        Workers come back on their own schedule, and a shared subscription with nobody
        subscribed drops what it gets; a worker's second answer is counted as late.
        """
        delay = 0.5
        while True:
            await asyncio.sleep(delay)
            again = [w for w in self.waiting.values() if w.outage and not w.future.done()]
            if not again:
                return
            for entry in again:
                await client.publish(self.request_topic, self.payload(entry.request), qos=1)
            delay = min(2 * delay, 8.0)

    def payload(self, request: InferenceRequest) -> bytes:
        body = encode_request(request)
        key = self.config.run_key
        return body if key is None else key.sign(self.request_topic, body)

    async def send(self, client: aiomqtt.Client, entry: _Waiting) -> None:
        entry.sent_on = self.connection
        await client.publish(self.request_topic, self.payload(entry.request), qos=1)

    async def send_batch(self, batch: list[_Waiting]) -> None:
        """One message for a batch; on a lost connection the reconnect re-sends each request."""
        client = self.client
        live = [entry for entry in batch if not entry.future.done()]
        if client is None or not live:
            return
        body = encode_batch([entry.request for entry in live])
        key = self.config.run_key
        try:
            await client.publish(self.request_topic, body if key is None else key.sign(self.request_topic, body),
                                 qos=1)
        except aiomqtt.MqttError as exc:
            self.warn("publish-failed", "%d requests not sent yet (%s); they go out after the reconnect",
                      len(live), exc)

    def expire(self, entries: list[_Waiting]) -> None:
        """Requests whose deadline passed while they waited for their batch: never sent."""
        for entry in entries:
            if not entry.future.done():
                entry.future.set_result(self.give_up(entry.request, "stale"))

    def receive(self, message: aiomqtt.Message) -> None:
        counters = self.counters
        payload = message.payload
        if not isinstance(payload, bytes):
            counters.malformed += 1
            self.warn("result-type", "malformed reply on %s: payload is %s, not bytes", message.topic, type(payload))
            return
        if self.config.run_key is not None:
            body = self.config.run_key.open(message.topic.value, payload)
            if body is None:
                counters.malformed += 1
                self.warn("result-unsigned", "reply on %s without a valid run-key signature dropped", message.topic)
                return
            payload = body
        results, errors = decode_batch(payload, decode_result)
        for exc in errors:
            counters.malformed += 1
            self.warn("result-decode", "malformed reply on %s dropped: %s", message.topic, exc)
        for result in results:
            self.accept(message, result)

    def accept(self, message: aiomqtt.Message, result: InferenceResult) -> None:
        counters = self.counters
        entry = self.waiting.get(result.id)
        if entry is None or entry.future.done():
            counters.late_replies += 1
            log.debug("late or unknown reply %s on %s dropped", result.id, message.topic)
            return
        problem = reply_problem(entry.request, result, self.config.max_line_chars)
        if problem is not None:
            counters.rejected_outputs += 1
            self.warn("reply-refused", "refused a reply to %s from worker %r: %s (logged once)", result.id,
                      result.worker, problem)
            entry.future.set_result(fallback_result(entry.request, "rejected", backend=result.backend, model="",
                                                    worker=result.worker))
            return
        entry.future.set_result(result)

    async def dispatch(self, request: InferenceRequest) -> InferenceResult:
        config, counters = self.config, self.counters
        if request.shard != config.shard:
            request = msgspec.structs.replace(request, shard=config.shard)
        if request.id in self.waiting:
            raise ValueError(f"inference request id {request.id!r} is already in flight")
        if request.deadline <= time.time():
            counters.dropped_stale += 1
            return self.give_up(request, "stale")
        future: asyncio.Future[InferenceResult] = asyncio.get_running_loop().create_future()
        entry = self.waiting[request.id] = _Waiting(request, future)
        wait = min(config.timeout, request.deadline - time.time()) + config.reply_grace
        try:
            async with asyncio.timeout(wait):
                await self.connected.wait()
                client = self.client
                if client is not None and entry.sent_on != self.connection:
                    entry.sent_on = self.connection  # in the next batch; the reconnect re-sends it if lost
                    self.outbox.put(entry, priority=request.priority, deadline=request.deadline)
                result = await future
        except TimeoutError:
            self.warn("timeout", "no reply to request %s of %s within %.2fs", request.id, request.agent_id, wait)
            return self.give_up(request, "timeout")
        finally:
            self.waiting.pop(request.id, None)
        if result.fallback_reason == "stale":
            counters.dropped_stale += 1
        return result

    def give_up(self, request: InferenceRequest, reason: str) -> InferenceResult:
        return fallback_result(request, reason, backend=self.config.backend, model="")


@contextlib.asynccontextmanager
async def open_mqtt_dispatch(config: PoolConfig, counters: Counters) -> AsyncIterator[Dispatch]:
    """Connect (a BrokerError after the reconnect patience), subscribe to this shard's replies,
    and hand out the dispatch function; the connection is kept up until the block ends."""
    link = _PoolLink(config, counters)
    try:
        async with asyncio.TaskGroup() as tg:
            connection = tg.create_task(stay_connected(
                config.broker, link.session, name=f"inference pool of shard {config.shard}",
                policy=config.reconnect, connect=link.new_client, on_lost=link.lost,
            ))
            sender = tg.create_task(link.outbox.run())
            try:
                await link.connected.wait()
                yield link.dispatch
            finally:
                connection.cancel()
                sender.cancel()
    except BaseExceptionGroup as group_error:
        raise single_error(group_error) from None


class RemoteWorker:
    """A worker that takes requests from the shared subscription until cancelled.

    It reconnects per its reconnect policy (forever by default) when the broker goes away;
    `ready` is set while it is subscribed. At most `concurrency` requests are served at
    once; the rest wait in the client's queue, and the deadline check drops those that
    waited too long.
    """

    def __init__(self, config: WorkerConfig, *, backend: Backend | None = None) -> None:
        self.config = config
        self.name = config.name or f"worker-{uuid.uuid4().hex[:8]}"
        self.ready = asyncio.Event()
        self._backend = backend
        self._counters = Counters()
        self._warn = LogOnce(log)
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
        async def session(client: aiomqtt.Client) -> None:
            await self._session(client, backend)

        await stay_connected(
            self.config.broker, session, name=f"worker {self.name}", policy=self.config.reconnect,
            connect=lambda: open_client(self.config.broker, identifier=self.name,
                                        max_inflight=4 * self.config.concurrency),
            on_lost=self.ready.clear,
        )

    async def _session(self, client: aiomqtt.Client, backend: Backend) -> None:
        slots = asyncio.Semaphore(self.config.concurrency)
        await client.subscribe(self._request_topic, qos=1)

        async def send(batch: list[tuple[str, InferenceResult]]) -> None:
            """One message per shard; a lost connection ends the session, which reconnects."""
            by_shard: dict[str, list[InferenceResult]] = {}
            for shard, result in batch:
                by_shard.setdefault(shard, []).append(result)
            key = self.config.run_key
            for shard, results in by_shard.items():
                topic = topics.infer_response(self.config.run_id, shard)
                body = encode_batch(results)
                try:
                    await client.publish(topic, body if key is None else key.sign(topic, body), qos=1)
                except aiomqtt.MqttError as exc:
                    self._warn("reply-lost", "%d replies lost with the connection (%s); the pool re-sends or "
                               "times them out", len(results), exc)
                    raise

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

    def _requests(self, message: aiomqtt.Message) -> list[InferenceRequest]:
        """The well-formed, signed requests of a message; each malformed one counted, logged once."""
        c = self._counters
        payload = message.payload
        if not isinstance(payload, bytes):
            c.malformed += 1
            self._warn("request-type", "malformed request on %s: payload is %s", message.topic, type(payload))
            return []
        if self.config.run_key is not None:
            body = self.config.run_key.open(topics.infer_request(self.config.run_id), payload)
            if body is None:
                c.malformed += 1
                self._warn("request-unsigned", "request on %s without a valid run-key signature dropped",
                           message.topic)
                return []
            payload = body
        decoded, errors = decode_batch(payload, decode_request)
        for exc in errors:
            c.malformed += 1
            self._warn("request-decode", "malformed request on %s dropped: %s", message.topic, exc)
        requests = []
        for request in decoded:
            try:
                topics.check_segment("shard", request.shard)
            except ValueError as exc:
                c.malformed += 1
                self._warn("request-shard", "request on %s dropped: %s", message.topic, exc)
                continue
            requests.append(request)
        return requests
