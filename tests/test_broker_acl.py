"""broker-config/auth.conf and acl on a real Mosquitto: players publish only their own input
and read only the public topics; anonymous clients are refused."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest

from tests.conftest import BROKER_CONFIG, MosquittoProcess, require_mosquitto

pytestmark = pytest.mark.mosquitto


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[MosquittoProcess]:
    passwd = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    passwords = tmp_path / "passwords"
    passwords.touch()
    for user in ("shard", "alice"):
        subprocess.run([passwd, "-b", str(passwords), user, f"{user}-secret"], check=True, timeout=10)
    broker = MosquittoProcess(require_mosquitto(), tmp_path, config="auth.conf")
    body = broker.config_path.read_text()
    body = body.replace("broker-config/passwords", str(passwords))
    body = body.replace("broker-config/acl", str(BROKER_CONFIG / "acl"))
    if os.geteuid() == 0:
        body += "user root\n"  # as root Mosquitto drops to 'mosquitto', who cannot read tmp_path
    broker.config_path.write_text(body)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def client(broker: MosquittoProcess, user: str | None) -> aiomqtt.Client:
    password = f"{user}-secret" if user else None
    return aiomqtt.Client("127.0.0.1", broker.port, username=user, password=password,
                          protocol=aiomqtt.ProtocolVersion.V5)


async def test_players_reach_only_their_own_input_and_the_public_topics(secured: MosquittoProcess) -> None:
    async with client(secured, "shard") as shard, client(secured, "alice") as alice:
        await shard.subscribe("npcsim/r/player/+/input", qos=1)
        await alice.subscribe("npcsim/r/agent/+/say", qos=1)
        await alice.subscribe("npcsim/r/infer/req", qos=1)  # refused by the ACL
        await alice.publish("npcsim/r/player/bob/input", b'{"to": "x", "text": "impostor"}', qos=0)
        await alice.publish("npcsim/r/player/alice/input", b'{"to": "x", "text": "mine"}', qos=1)
        async with asyncio.timeout(5):
            async for message in shard.messages:
                assert message.topic.value == "npcsim/r/player/alice/input", "bob's input was let through"
                break
        await shard.publish("npcsim/r/infer/req", b"internal", qos=1)
        await shard.publish("npcsim/r/agent/innkeeper/say", b'{"text": "public"}', qos=1)
        async with asyncio.timeout(5):
            async for message in alice.messages:
                assert message.topic.value == "npcsim/r/agent/innkeeper/say", "a player read an internal topic"
                break


async def test_anonymous_clients_are_refused(secured: MosquittoProcess) -> None:
    with pytest.raises(aiomqtt.MqttError):
        async with client(secured, None):
            pass
