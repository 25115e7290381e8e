"""Which run instance a shard belongs to: its store's identity, checked at start, and the run nonce.

A store belongs to one run (sim.store.RunIdentity: run id, seed, scenario digest, shard
layout, run nonce). `claim_store` refuses a start that is another run, in one line naming
both, and otherwise returns the run's nonce, which binds every signed internal message to
this run instance (sim.protocol.seal):

- a store that has an identity gives its nonce: every resume of any shard keeps it;
- shard 0, on its first start, chooses it (at random);
- any other shard, on its first start with a run key, learns it from shard 0
  (`learn_run_nonce`): it sends a `Hello` with a fresh random challenge and believes only
  a `Welcome` that echoes that challenge, sealed with the key and the nonce it announces.
  A Welcome recorded in another run echoes another challenge, so a replay teaches
  nothing; a shard that starts before shard 0 says Hello again every second until shard 0
  answers. Without a run key nothing is sealed, and the nonce is the shard's own.

A store from before identities is claimed for the run that starts it, with a log line.
`kept_messages` checks, on --resume, that what the store kept for re-sending opens with
this start's key: a resumed shard that cannot open its own messages would wait for itself
for ever, so that is one error naming the run key instead.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

from sim.errors import ConfigError, single_error
from sim.mqtt import BrokerAddress, ClientOptions, Link, MqttTransport, ReconnectPolicy, Transport
from sim.protocol.seal import RunKey, new_nonce, sealed_nonce
from sim.scenario import Scenario
from sim.shard._clock import Clock
from sim.shard._run_config import RunConfig, parse_shard
from sim.store import RunIdentity, RunSettings, Store
from sim.wire import topics
from sim.wire.barrier import Hello, Welcome, decode_barrier, encode_barrier

__all__ = ["claim_store", "kept_messages", "learn_run_nonce", "run_claim", "run_key_source"]

log = logging.getLogger(__name__)

_HELLO_EVERY = 1.0  # seconds between Hellos while shard 0 does not answer
_SAY_WAITING_EVERY = 10  # Hellos between two "still waiting" log lines

LearnNonce = Callable[[], Awaitable[bytes]] | None
"""How a shard that is not shard 0 learns the nonce at its first start (None: it chooses it)."""


def run_claim(config: RunConfig, *, run_id: str, seed: int, scenario: Scenario, sha256: str) -> RunIdentity:
    """The identity this start claims (its nonce still empty): from the config and the scenario
    read (with the run's overrides), with the settings a re-execution needs (sim.replay)."""
    index, count = parse_shard(config.shard)
    options = dict(config.inference.backend_options)
    end = config.until_tick if config.until_tick is not None else (
        config.ticks if config.ticks is not None else scenario.scenario.ticks)
    settings = RunSettings(
        memory=scenario.memory, end_tick=end, tick_ms=config.tick_ms, bots=config.bots, bot_rate=config.bot_rate,
        inference_timeout=config.inference.inference_timeout, backend=config.inference.backend, backend_options=options,
        model=RunSettings.model_named(options), remote_workers=config.inference.placement == "remote",
        retain_memories=config.record.retain_memories, fact_guard=config.inference.fact_guard,
    )
    return RunIdentity(
        run_id=run_id, seed=seed, scenario=scenario.scenario.name, scenario_sha256=sha256, shard=f"{index}/{count}",
        nonce="", settings=settings,
    )


async def claim_store(
    store: Store, claim: RunIdentity, config: RunConfig, learn: LearnNonce, scenario_data: bytes | None = None
) -> bytes:
    """The run nonce of the store `claim` may use; ConfigError when the store is another run's.

    A first start records the claim, and `scenario_data` (the bytes the run read) beside it."""
    stored = store.identity
    if stored is not None:
        if not stored.same_run(claim):
            option = "--resume" if config.record.resume else "--db"
            scenario = stored.scenario_sha256 != claim.scenario_sha256
            raise ConfigError(
                f"{option}: {store.path} belongs to {stored.describe(scenario=scenario)}, "
                f"not {claim.describe(scenario=scenario)}"
            )
        return bytes.fromhex(stored.nonce)
    nonce = new_nonce() if learn is None else await learn()
    identity = msgspec.structs.replace(claim, nonce=nonce.hex())
    if store.last_tick is not None:
        log.warning("%s holds ticks but no run identity: it now belongs to %s",
                    store.path, identity.describe(scenario=True))
    await store.keep_identity(identity, scenario_data)
    return nonce


def run_key_source(config: RunConfig) -> str:
    """The run key of this start, in words, for errors (never the key itself)."""
    if config.broker.run_key_file is not None:
        return f"--run-key-file {config.broker.run_key_file}"
    if config.record.db is not None:
        return f"the run key kept in {config.record.db}.key"
    return "the run key made for this start"


def kept_messages(
    sent: list[tuple[int, str, bytes]], key: RunKey | None, config: RunConfig
) -> list[tuple[int, str, bytes]]:
    """What the store kept for re-sending that this start can send again; a message this
    start's key does not open stops the start, naming the key."""
    usable = []
    for tick, topic, payload in sent:
        sealed = sealed_nonce(payload) is not None
        if (key is None and not sealed) or (key is not None and key.open(topic, payload) is not None):
            usable.append((tick, topic, payload))
            continue
        db = config.record.db or "the store"
        if key is None:
            raise ConfigError(
                f"--resume: what {db} kept of tick {tick} is sealed with a run key, and this start has none: "
                "give --run-key-file the key of the run's first start"
            )
        if not sealed:
            raise ConfigError(
                f"--resume: what {db} kept of tick {tick} is not sealed (the run's first start had no run key), "
                f"and this start has {run_key_source(config)}: resume it as it started"
            )
        raise ConfigError(
            f"--resume: what {db} kept of tick {tick} is sealed with another run key than {run_key_source(config)}, "
            "so this shard would refuse its own messages and wait for itself: resume with the key of the run's "
            "first start"
        )
    return usable


async def learn_run_nonce(
    address: BrokerAddress,
    key: RunKey,
    *,
    run_id: str,
    shard: str,
    shards: int,
    clock: Clock,
    protocol: Literal[5, 311] = 5,
    transport: Transport | None = None,
) -> bytes:
    """Ask shard 0 for the run nonce until it answers (sim.protocol.seal); the nonce.

    `transport` defaults to MQTT to `address`."""
    learned: list[bytes] = []

    async def session(link: Link) -> None:
        try:
            await _ask(link, key, run_id, shard, shards, clock, learned)
        except BaseExceptionGroup as group:
            raise single_error(group) from None

    log.info("shard %s: asking shard 0 for the run nonce", shard)
    transport = transport or MqttTransport(
        address, name=f"shard {shard} (run nonce)", policy=ReconnectPolicy(initial=0.05),
        client=ClientOptions(protocol=protocol),
    )
    await transport.run(session)
    log.info("shard %s: shard 0 told the run nonce", shard)
    return learned[0]


async def _ask(
    link: Link, key: RunKey, run_id: str, shard: str, shards: int, clock: Clock, learned: list[bytes]
) -> None:
    answered = asyncio.Event()
    challenges: set[str] = set()

    async def listen() -> None:
        async for topic, payload, _ in link.messages():
            nonce = _welcome_nonce(topic, payload, key, run_id, shards, challenges)
            if nonce is not None:
                learned.append(nonce)
                answered.set()
                return

    hello_topic = topics.barrier(run_id, shard)
    unbound = RunKey(key.secret)  # a Hello is sealed with the unbound nonce
    await link.subscribe([topics.barrier(run_id, "0")])
    async with asyncio.TaskGroup() as group:
        listener = group.create_task(listen())
        hellos = 0
        while not answered.is_set():
            challenge = secrets.token_hex(16)
            challenges.add(challenge)
            hello = Hello(shard=shard, shards=shards, challenge=challenge)
            await link.publish(hello_topic, unbound.sign(hello_topic, encode_barrier(hello)), qos=1, retain=False)
            hellos += 1
            if hellos % _SAY_WAITING_EVERY == 0:
                log.warning("shard %s: waiting for shard 0 to tell the run nonce (asked %d times); "
                            "start shard 0 of the run with the same run key", shard, hellos)
            await clock.wait(answered, _HELLO_EVERY)
        await listener


def _welcome_nonce(
    topic: str, payload: bytes, key: RunKey, run_id: str, shards: int, challenges: set[str]
) -> bytes | None:
    """The nonce of a Welcome from shard 0 answering one of our challenges, sealed with it; else None."""
    opened = key.open_any(topic, payload)
    if opened is None:
        return None
    nonce, body = opened
    try:
        welcome = decode_barrier(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not isinstance(welcome, Welcome) or welcome.challenge not in challenges or welcome.nonce != nonce.hex():
        return None
    if welcome.shards != shards:
        raise ConfigError(
            f"--shard: shard 0 of run {run_id} runs as 0/{welcome.shards}, this one with {shards} shards: "
            "every shard of a run needs the same count"
        )
    return nonce
