"""The pool's end of the MQTT transport: publish requests, match the replies, ride out outages.

Requests go QoS 1 to `npcsim/{run}/infer/req`, where remote workers (`sim.inference._worker`)
share them; replies come back on `npcsim/{run}/infer/resp/{shard}` and are matched by
correlation id (the request id). A request whose reply has not come by its deadline (plus
a short grace, so that a worker's own "stale" answer can arrive) gets the fallback with
reason "timeout"; a reply that comes later is counted as late and dropped. Malformed
payloads are counted, logged once per kind, and dropped. Requests and replies travel in
batches (`sim.inference._batch`); with a run key every payload is sealed
(`sim.protocol.seal`).

The link connects through a `sim.mqtt.Transport` (MQTT by default) and rides out a broker restart: it re-sends, on the
new connection, every request still waiting for its reply, and again with backoff
(`sim.backoff`) until it is answered, since workers come back on their own schedule (a
worker's second answer is counted as late). A worker that dies holding requests (kill -9)
is noticed by its last will on `infer/worker/{name}`: every request sent and not answered
yet is re-sent at once, then with the same backoff until answered (which worker held
which is the broker's secret; the others' second answers are dropped as late). A forged
will costs at most a re-send round per `RESEND_GAP`, like a reconnect.

A reply is trusted no more than a model:
`sim.inference._replies` holds it to what the pool could have produced itself, so a
client that answers in a worker's place cannot make an NPC say what the checks would
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

import msgspec

from sim.backoff import Backoff, BackoffPolicy
from sim.errors import BrokerError, single_error
from sim.inference._batch import LINGER, MAX_ITEMS, BatchSender, read_batch
from sim.inference._counters import Counters, LogOnce
from sim.inference._dispatch import Dispatch, fallback_result
from sim.inference._pool_config import PoolConfig
from sim.inference._replies import reply_problem
from sim.mqtt import ClientOptions, Link, MqttTransport, Transport, topic_matches
from sim.output import FactGuard
from sim.protocol.batcher import Batcher
from sim.protocol.seal import seal
from sim.wire import topics
from sim.wire.batch import encode_batch
from sim.wire.inference import (
    WORKER_OFFLINE,
    InferenceRequest,
    InferenceResult,
    decode_result,
    decode_worker_limits,
    encode_request,
)

__all__ = ["RESEND_BACKOFF", "RESEND_GAP", "open_mqtt_dispatch"]

log = logging.getLogger(__name__)

RESEND_BACKOFF = BackoffPolicy(initial=0.5, maximum=8.0)
"""Waits between re-sends of the requests that waited through an outage or lost their worker (seconds)."""
RESEND_GAP = RESEND_BACKOFF.initial / 2
"""The least time between two re-send rounds, however many workers' wills come (seconds)."""


@dataclass
class _Waiting:
    request: InferenceRequest
    future: asyncio.Future[InferenceResult]
    sent_on: int = 0  # the connection it was last published on (0: none yet)
    resending: bool = False  # it waited through a lost connection or lost its worker: re-sent until answered


class _PoolLink:
    """The pool's connection: requests waiting for replies survive a reconnect and are re-sent."""

    def __init__(self, config: PoolConfig, counters: Counters, guard: FactGuard) -> None:
        self.config = config
        self.counters = counters
        self.guard = guard
        self.warn = LogOnce(log)
        self.request_topic = topics.infer_request(config.run_id)
        self.workers_topic = topics.infer_workers(config.run_id)
        self.resend_due = asyncio.Event()  # a worker's will came: re-send what is unanswered now
        self.will_logged = -RESEND_GAP
        self.response_topic = topics.infer_response(config.run_id, config.shard)
        self.identifier = f"npcsim-pool-{config.shard}-{uuid.uuid4().hex[:8]}"
        self.waiting: dict[str, _Waiting] = {}
        self.connected = asyncio.Event()
        self.link: Link | None = None
        self.connection = 0
        self.outbox = BatchSender(Batcher[_Waiting](max_items=MAX_ITEMS, linger=LINGER), self.send_batch, self.expire)

    def transport(self) -> MqttTransport:
        return MqttTransport(
            self.config.broker, name=f"inference pool of shard {self.config.shard}", policy=self.config.reconnect,
            client=ClientOptions(identifier=self.identifier, max_inflight=2 * self.config.max_in_flight),
        )

    def lost(self) -> None:
        self.connected.clear()
        self.link = None

    async def session(self, link: Link) -> None:
        await link.subscribe([self.response_topic])
        await link.subscribe([self.workers_topic])
        self.connection += 1
        self.link = link
        self.connected.set()
        resend = [w for w in self.waiting.values() if w.sent_on != self.connection and not w.future.done()]
        if resend and self.connection > 1:
            log.warning("re-sending %d inference requests after the reconnect", len(resend))
            self.counters.resent += len(resend)
        for entry in resend:
            entry.resending = entry.resending or self.connection > 1
            await self.send(link, entry)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.resend_unanswered(link))
            async for topic, payload, _ in link.messages():
                if topic_matches(topic, self.workers_topic):
                    self.worker_said(topic, payload)
                else:
                    self.receive(topic, payload)

    def unanswered(self) -> list[_Waiting]:
        return [w for w in self.waiting.values() if w.resending and not w.future.done()]

    async def resend_unanswered(self, link: Link) -> None:
        """Re-send requests that waited through an outage or lost their worker, with backoff, until answered.

        Workers come back on their own schedule, and a shared subscription with nobody
        subscribed drops what it gets; a worker's second answer is counted as late. A
        worker's will starts a round at once (and the backoff over), but rounds are at
        least `RESEND_GAP` apart.
        """
        backoff = Backoff(RESEND_BACKOFF)
        while True:
            wait = backoff.next() if self.unanswered() else None
            try:
                async with asyncio.timeout(wait):
                    await self.resend_due.wait()
                self.resend_due.clear()
                backoff.reset()
            except TimeoutError:
                pass
            again = self.unanswered()
            for entry in again:
                await self.send(link, entry)
            self.counters.resent += len(again)
            await asyncio.sleep(RESEND_GAP)

    def worker_said(self, topic: str, payload: bytes) -> None:
        """A worker's word on its status topic: its servers' limits, or "offline" (its last will)."""
        key = self.config.run_key
        body: bytes | None = payload
        if key is not None:
            opened = key.open_any(topic, payload)  # a worker seals for any instance of the run
            body = None if opened is None else opened[1]
        if body == WORKER_OFFLINE:
            self.worker_gone(topic)
            return
        worker = topics.parse(topic)
        try:
            said = None if body is None or worker is None else decode_worker_limits(body)
        except msgspec.DecodeError:
            said = None
        if said is None or worker is None:
            self.counters.malformed += 1
            self.warn("worker-status", "worker status on %s dropped: not sealed limits nor \"offline\"", topic)
            return
        self.counters.hear_limits(worker.name, dict(said.limits))

    def worker_gone(self, topic: str) -> None:
        """A worker's last will: every request sent and not answered yet goes out again."""
        held = [w for w in self.waiting.values() if w.sent_on and not w.future.done()]
        for entry in held:
            entry.resending = True
        now = time.monotonic()
        level = logging.WARNING if now - self.will_logged >= RESEND_GAP else logging.DEBUG
        self.will_logged = now
        worker = topics.parse(topic)
        if worker is not None:
            self.counters.forget_worker(worker.name)
        log.log(level, "worker %s is gone (its last will): re-sending the %d inference requests of shard %s "
                "waiting for replies", worker.name if worker else topic, len(held), self.config.shard)
        if held:
            self.resend_due.set()

    async def send(self, link: Link, entry: _Waiting) -> None:
        """One request alone, at once: the re-sends after a reconnect."""
        entry.sent_on = self.connection
        body = encode_request(entry.request)
        await link.publish(self.request_topic, seal(self.config.run_key, self.request_topic, body), qos=1, retain=False)

    async def send_batch(self, batch: list[_Waiting]) -> None:
        """One message for a batch; on a lost connection the reconnect re-sends each request."""
        link = self.link
        live = [entry for entry in batch if not entry.future.done()]
        if link is None or not live:
            return
        body = encode_batch([entry.request for entry in live])
        try:
            await link.publish(self.request_topic, seal(self.config.run_key, self.request_topic, body), qos=1,
                               retain=False)
        except BrokerError as exc:
            self.warn("publish-failed", "%d requests not sent yet (%s); they go out after the reconnect",
                      len(live), exc)

    def expire(self, entries: list[_Waiting]) -> None:
        """Requests whose deadline passed while they waited for their batch: never sent."""
        for entry in entries:
            if not entry.future.done():
                entry.future.set_result(self.give_up(entry.request, "stale"))

    def receive(self, topic: str, payload: bytes) -> None:
        results = read_batch(
            payload, decode_result, topic=topic, key=self.config.run_key, what="reply",
            counters=self.counters, warn=self.warn,
        )
        for result in results:
            self.accept(topic, result)

    def accept(self, topic: str, result: InferenceResult) -> None:
        counters = self.counters
        entry = self.waiting.get(result.id)
        if entry is None or entry.future.done():
            counters.late_replies += 1
            log.debug("late or unknown reply %s on %s dropped", result.id, topic)
            return
        problem = reply_problem(entry.request, result, self.config.rules, self.guard)
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
                if self.link is not None and entry.sent_on != self.connection:
                    entry.sent_on = self.connection  # in the next batch; the reconnect re-sends it if lost
                    self.outbox.put(entry, priority=request.priority, deadline=request.deadline)
                result = await future
        except TimeoutError:
            self.warn(
                "timeout", "no reply to request %s of %s within %.2fs: is a worker serving run %s? Start one with "
                "`npcsim worker --broker %s --run %s` (for --broker auto, the run's start-up log gives the whole "
                "command, with its login)", request.id, request.agent_id, wait, config.run_id,
                config.broker.with_login(None, None).url, config.run_id,
            )
            return self.give_up(request, "timeout")
        finally:
            self.waiting.pop(request.id, None)
        if result.fallback_reason == "stale":
            counters.dropped_stale += 1
        return result

    def give_up(self, request: InferenceRequest, reason: str) -> InferenceResult:
        return fallback_result(request, reason, backend=self.config.backend, model="")


@contextlib.asynccontextmanager
async def open_mqtt_dispatch(
    config: PoolConfig, counters: Counters, guard: FactGuard, *, transport: Transport | None = None
) -> AsyncIterator[Dispatch]:
    """Connect (a BrokerError after the reconnect patience), subscribe to this shard's replies,
    and hand out the dispatch function; the connection is kept up until the block ends.
    Replies are judged again with `guard`, the workers' fact guard. `transport` defaults to
    MQTT to `config.broker`."""
    link = _PoolLink(config, counters, guard)
    try:
        async with asyncio.TaskGroup() as tg:
            connection = tg.create_task((transport or link.transport()).run(link.session, on_lost=link.lost))
            sender = tg.create_task(link.outbox.run())
            try:
                await link.connected.wait()
                yield link.dispatch
            finally:
                connection.cancel()
                sender.cancel()
    except BaseExceptionGroup as group_error:
        raise single_error(group_error) from None
