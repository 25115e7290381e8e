"""broker-config/auth.conf and acl on a real Mosquitto: every role may publish and read
exactly what docs/operations.md ("Who may publish and read what") says; anonymous clients are refused.
Two players' logins: each reads its own errors only, and neither may publish the game
system's topics (events, facts, moves, goals, presence)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiomqtt
import pytest

from tests.secured import SecuredBroker, password, secured_broker

pytestmark = pytest.mark.mosquitto

R = "npcsim/r"
PUBLISH = {  # role -> topics it may publish; every role tries every topic
    "shard": {"loc/square/events", "agent/a/inbox", "agent/a/say", "agent/a/location", "infer/req", "status/0",
              "world/state", "barrier/0"},
    "worker": {"infer/resp/0", "infer/worker/w"},
    "game": {"world/state", "game/event", "game/fact", "game/move", "game/goal", "player/alice/presence"},
    "viewer": {"player/viewer/input"},
    "alice": {"player/alice/input"},
}
TOPICS = sorted({*(t for ts in PUBLISH.values() for t in ts), "player/bob/input", "trace/0", "roster/0",
                 "player/alice/error", "player/bob/error", "game/error"})
PUBLIC = {"agent/a/say", "agent/a/location", "world/state", "status/0", "roster/0"}
READ = {  # role -> topics it may read, of those the shard publishes: the public ones, and
    "worker": {*PUBLIC, "infer/req"},
    "game": {*PUBLIC, "game/error"},
    "viewer": {*PUBLIC, "trace/0", "player/bob/input", "player/alice/input", "player/viewer/input",
               "player/alice/error", "player/bob/error"},  # what players say, and what the run refused them
    "alice": {*PUBLIC, "player/alice/error"},  # its own errors, never bob's
    "bob": {*PUBLIC, "player/bob/error"},
}


@pytest.fixture
def secured() -> Iterator[SecuredBroker]:
    with secured_broker() as broker:
        yield broker


def client(broker: SecuredBroker, user: str | None) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", broker.port, username=user, password=password(user) if user else None,
                          protocol=aiomqtt.ProtocolVersion.V5)


async def collect(c: aiomqtt.Client, until: str) -> set[str]:
    """Topics received (under npcsim/r/) until the marker topic arrives."""
    got: set[str] = set()
    async with asyncio.timeout(10):
        async for message in c.messages:
            topic = message.topic.value.removeprefix(R + "/")
            if topic == until:
                return got
            got.add(topic)
    return got


async def test_each_role_publishes_only_what_it_may(secured: SecuredBroker) -> None:
    async with client(secured, "shard") as shard:
        await shard.subscribe(f"{R}/#", qos=1)
        for role in PUBLISH:
            async with client(secured, role) as c:
                for topic in TOPICS:
                    await c.publish(f"{R}/{topic}", role.encode(), qos=1)
            await shard.publish(f"{R}/agent/marker/say", b"", qos=1)
            got = await collect(shard, "agent/marker/say")
            if role == "shard":
                assert got == set(TOPICS), got
            else:
                assert got == PUBLISH[role], (role, got)


async def test_each_role_reads_only_what_it_may(secured: SecuredBroker) -> None:
    async with client(secured, "shard") as shard:
        for role, allowed in READ.items():
            async with client(secured, role) as c:
                await c.subscribe(f"{R}/#", qos=1)
                await c.subscribe(f"$share/g/{R}/infer/req", qos=1)
                for topic in TOPICS:
                    await shard.publish(f"{R}/{topic}", b"x", qos=1)
                await shard.publish(f"{R}/agent/a/say", b"end", qos=1)
                got: set[str] = set()
                async with asyncio.timeout(10):
                    async for message in c.messages:
                        got.add(message.topic.value.removeprefix(R + "/"))
                        if message.payload == b"end":
                            break
            assert got == allowed, (role, got)


async def test_anonymous_clients_are_refused(secured: SecuredBroker) -> None:
    with pytest.raises(aiomqtt.MqttError):
        async with client(secured, None):
            pass


async def test_subscribe_check_tells_a_login_what_it_may_publish(
    secured: SecuredBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    """`npcsim subscribe --broker URL --check`: the broker's own answer, channel by channel, as the ACL says."""
    from tests.helpers import npcsim_in_process

    said: dict[str, dict[str, str]] = {}
    for login in ("game", "alice"):
        ran = await asyncio.to_thread(npcsim_in_process, capsys, "subscribe", "--broker", secured.url_for(login),
                                      "--check")
        assert ran.code == 0, ran.err
        head, *rows = ran.out.splitlines()
        assert head.startswith(f"{login} on mqtt://{login}@127.0.0.1:{secured.port}: what it may publish")
        said[login] = {row.split("\t")[0]: row.split("\t")[-1] for row in rows}
    game, alice = said["game"], said["alice"]
    for channel in ("game-fact", "game-event", "game-move", "game-goal", "world-state", "presence"):
        assert game[channel] == "yes" and alice[channel] == "refused (Not authorized)", channel
    assert game["player-input"] == alice["player-input"] == "yes"  # as the player its login names
    for channel in ("say", "intent", "location", "status", "roster", "trace", "player-error", "game-error"):
        assert game[channel] == alice[channel] == "refused (Not authorized)", channel
