"""The MQTT transport: the pool's side (publish, wait for the reply) and the remote worker.

Requests go QoS 1 to `npcsim/{run}/infer/req`; workers consume them through the shared
subscription `$share/{group}/npcsim/{run}/infer/req`, so any number of workers share the
load; replies go to `npcsim/{run}/infer/resp/{shard}` and are matched by correlation id
(the request id). A request whose reply has not come by its deadline (plus a short grace,
so that a worker's own "stale" answer can arrive) gets the fallback with reason "timeout";
a reply that comes later is counted as late and dropped. Malformed payloads are counted,
logged once per kind, and dropped.

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

from sim import topics
from sim.errors import single_error
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
    encode_result,
)
from sim.inference.backends import Backend, open_backend
from sim.mqtt import open_client, stay_connected

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
        try:
            result = decode_result(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            counters.malformed += 1
            self.warn("result-decode", "malformed reply on %s dropped: %s", message.topic, exc)
            return
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
                    try:
                        await self.send(client, entry)
                    except aiomqtt.MqttError as exc:  # the reconnect re-sends it
                        self.warn("publish-failed", "request %s not sent yet (%s); it goes out after the "
                                  "reconnect", request.id, exc)
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
            try:
                await link.connected.wait()
                yield link.dispatch
            finally:
                connection.cancel()
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
        self.ready.set()
        log.info("worker %s serving %s with backend %s", self.name, self._request_topic, backend.name)
        async with asyncio.TaskGroup() as tg:
            async for message in client.messages:
                await slots.acquire()
                tg.create_task(self._handle(client, backend, message, slots))

    async def _handle(
        self, client: aiomqtt.Client, backend: Backend, message: aiomqtt.Message, slots: asyncio.Semaphore
    ) -> None:
        """Serve one message; the slot is freed before the reply's PUBACK round trip."""
        c = self._counters
        c.in_flight += 1
        c.in_flight_peak = max(c.in_flight_peak, c.in_flight)
        try:
            result = await self._serve_payload(backend, message)
        finally:
            c.in_flight -= 1
            slots.release()
        if result is not None:
            reply_topic = topics.infer_response(self.config.run_id, result[0])
            body = encode_result(result[1])
            key = self.config.run_key
            try:
                await client.publish(reply_topic, body if key is None else key.sign(reply_topic, body), qos=1)
            except aiomqtt.MqttError as exc:
                self._warn("reply-lost", "reply %s lost with the connection (%s); the pool re-sends or "
                           "times it out", result[1].id, exc)
                raise

    async def _serve_payload(
        self, backend: Backend, message: aiomqtt.Message
    ) -> tuple[str, InferenceResult] | None:
        c = self._counters
        payload = message.payload
        if not isinstance(payload, bytes):
            c.malformed += 1
            self._warn("request-type", "malformed request on %s: payload is %s", message.topic, type(payload))
            return None
        if self.config.run_key is not None:
            body = self.config.run_key.open(topics.infer_request(self.config.run_id), payload)
            if body is None:
                c.malformed += 1
                self._warn("request-unsigned", "request on %s without a valid run-key signature dropped",
                           message.topic)
                return None
            payload = body
        try:
            request = decode_request(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            c.malformed += 1
            self._warn("request-decode", "malformed request on %s dropped: %s", message.topic, exc)
            return None
        try:
            topics.check_segment("shard", request.shard)
        except ValueError as exc:
            c.malformed += 1
            self._warn("request-shard", "request on %s dropped: %s", message.topic, exc)
            return None
        c.requests += 1
        result = await serve(
            request, backend, time_limit=self.config.timeout, max_line_chars=self.config.max_line_chars,
            counters=c, worker=self.name, warn=self._warn,
        )
        c.count_result(result)
        return request.shard, result
