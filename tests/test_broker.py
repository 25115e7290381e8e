"""`--broker auto`: a private Mosquitto that never outlives the shard."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
from pathlib import Path
from typing import Literal

import aiomqtt
import psutil
import pytest

from sim import broker as broker_module
from sim.broker import free_port, open_broker
from sim.errors import BrokerError, ConfigError
from sim.mqtt import open_client
from sim.shard import BrokerConfig
from tests.helpers import VILLAGE, ended, read_until, require_mosquitto, start_npcsim

pytestmark = pytest.mark.mosquitto


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def ws_port_of(url: str | None) -> int:
    assert url is not None and url.startswith("ws://127.0.0.1:"), url
    return int(url.rsplit(":", 1)[1])


async def start_run(*extra: str, tmpdir: Path | None = None) -> tuple[asyncio.subprocess.Process, int]:
    """`npcsim run --broker auto`, with its temp files under `tmpdir` when given."""
    env = {"TMPDIR": str(tmpdir)} if tmpdir is not None else None
    proc = await start_npcsim("-v", "run", VILLAGE, "--broker", "auto", "--quiet", *extra,
                              stdout=asyncio.subprocess.DEVNULL, env=env)
    assert proc.stderr is not None
    async with asyncio.timeout(15):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, "the run ended before it started mosquitto"
            match = re.search(r"started mosquitto \(pid (\d+)\)", line)
            if match:
                return proc, int(match.group(1))


async def test_auto_leaves_no_mosquitto_and_no_temp_files_after_normal_exit(tmp_path: Path) -> None:
    require_mosquitto()
    proc, pid = await start_run("--ticks", "5", tmpdir=tmp_path)
    end = await ended(proc, within=60)
    assert end.code == 0, end.err
    assert gone(pid)
    assert not os.listdir(tmp_path), "temp files left behind"


async def test_auto_leaves_no_mosquitto_and_no_temp_files_after_sigterm(tmp_path: Path) -> None:
    require_mosquitto()
    proc, pid = await start_run("--ticks", "100000", "--tick-ms", "50", tmpdir=tmp_path)
    assert psutil.pid_exists(pid)
    assert proc.stderr is not None
    await read_until(proc.stderr, b"start-up: running")  # the run is under way: SIGTERM stops its ticks
    end = await ended(proc, within=15, terminate=True)
    assert end.code == 0, end.err
    assert "SIGTERM" in end.err
    assert gone(pid)
    assert not os.listdir(tmp_path), "temp files left behind"


async def test_auto_in_process_stops_on_cancellation() -> None:
    require_mosquitto()
    pids = []
    started = asyncio.Event()

    async def hold() -> None:
        async with open_broker("auto") as info:
            pids.append(info.pid)
            started.set()
            await asyncio.Event().wait()  # held until the test cancels it

    async with asyncio.TaskGroup() as group:
        task = group.create_task(hold())
        async with asyncio.timeout(10):
            await started.wait()
        task.cancel()
    assert pids[0] is not None and gone(pids[0])


async def test_bad_broker_url_is_refused() -> None:
    with pytest.raises(ConfigError, match="expected mqtt://host:port"):
        async with open_broker("http://example"):
            pass


async def test_auto_leaves_no_mosquitto_and_no_broker_files_after_kill_9() -> None:
    require_mosquitto()
    proc, pid = await start_run("--ticks", "100000", "--tick-ms", "50")
    config = Path(psutil.Process(pid).cmdline()[-1])
    assert config.name == "mosquitto.conf"
    assert not config.parent.exists(), "the broker's files outlive its start"
    proc.kill()
    await proc.wait()
    with contextlib.suppress(psutil.NoSuchProcess):
        await asyncio.to_thread(psutil.Process(pid).wait, 15)  # raises TimeoutExpired if it stays
    assert gone(pid)
    assert proc.stderr is not None
    assert b"Traceback" not in await proc.stderr.read()


@pytest.mark.parametrize("transport", ["tcp", "websockets"])
async def test_auto_is_private_anonymous_clients_reach_only_public_topics_and_player_input(
    transport: Literal["tcp", "websockets"],
) -> None:
    """On either listener: a browser's way in (WebSockets) is no wider than the MQTT port."""
    require_mosquitto()
    async with open_broker("auto") as info:
        assert info.address.username == "shard" and info.worker.username == "worker" and info.acl
        assert info.address.password and info.address.password not in info.url
        port = info.address.port if transport == "tcp" else ws_port_of(info.ws_url)
        async with open_client(info.address) as shard, aiomqtt.Client("127.0.0.1", port, transport=transport) as anon:
            await shard.subscribe("npcsim/r/#", qos=1)
            await anon.subscribe("npcsim/r/infer/req", qos=1)
            await anon.subscribe("npcsim/r/agent/+/say", qos=1)
            for topic in ("npcsim/r/loc/square/events", "npcsim/r/agent/a/inbox", "npcsim/r/infer/resp/0",
                          "npcsim/r/world/state", "npcsim/r/status/0", "npcsim/r/player/p/input"):
                await anon.publish(topic, b"x", qos=1)
            async with asyncio.timeout(10):
                async for message in shard.messages:
                    assert message.topic.value == "npcsim/r/player/p/input", message.topic
                    break
            await shard.publish("npcsim/r/infer/req", b"internal", qos=1)
            await shard.publish("npcsim/r/agent/a/say", b"public", qos=1)
            async with asyncio.timeout(10):
                async for message in anon.messages:
                    assert message.topic.value == "npcsim/r/agent/a/say", message.topic
                    break
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client("127.0.0.1", port, transport=transport, username="shard", password="guessed"):
                pass


async def test_auto_websocket_port_is_the_one_asked_for_and_only_for_auto() -> None:
    require_mosquitto()
    wanted = free_port()
    async with open_broker("auto", ws_port=wanted) as info:
        assert info.ws_url == f"ws://127.0.0.1:{wanted}"
        async with aiomqtt.Client("127.0.0.1", wanted, transport="websockets"):
            pass
    with pytest.raises(ConfigError, match=r"broker\.ws_port applies to --broker auto"):
        async with open_broker("mqtt://127.0.0.1:1883", ws_port=wanted):
            pass


@pytest.mark.parametrize("port", [0, 65536, True, "9001"])
def test_a_library_websocket_port_out_of_range_is_one_line(port: object) -> None:
    with pytest.raises(ConfigError, match=r"broker\.ws_port must be"):
        BrokerConfig(ws_port=port)  # type: ignore[arg-type]


async def test_auto_websocket_port_in_use_is_one_clear_error() -> None:
    require_mosquitto()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"broker\.ws_port {port}: 127\.0\.0\.1:{port} is taken"):
            async with open_broker("auto", ws_port=port):
                pass


def mosquitto_without_websockets(directory: Path) -> str:
    """A mosquitto as a build without WebSockets behaves: it refuses a `protocol websockets` config."""
    script = directory / "mosquitto"
    script.write_text(f"""#!/bin/sh
if grep -q "protocol websockets" "$2"; then echo "1: Error: Websockets support not available." >&2; exit 3; fi
exec {require_mosquitto()} "$@"
""")
    script.chmod(0o755)
    return str(script)


async def test_auto_runs_without_websockets_on_a_mosquitto_built_without_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(broker_module, "find_mosquitto", lambda: mosquitto_without_websockets(tmp_path))
    async with open_broker("auto") as info:
        assert info.kind == "mosquitto" and info.ws_url is None
        async with open_client(info.address):
            pass
    assert "has no WebSocket support" in caplog.text
    with pytest.raises(BrokerError, match="Websockets support not available"):  # asked for: an error
        async with open_broker("auto", ws_port=free_port()):
            pass


async def test_embedded_broker_serves_websockets_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_module, "find_mosquitto", lambda: None)
    async with open_broker("auto") as info:
        assert info.kind == "embedded"
        port = ws_port_of(info.ws_url)
        async with aiomqtt.Client("127.0.0.1", port, transport="websockets", protocol=aiomqtt.ProtocolVersion.V311) \
                as browser, open_client(info.address, protocol=311) as shard:
            await browser.subscribe("npcsim/r/agent/+/say", qos=1)
            await shard.publish("npcsim/r/agent/a/say", b"public", qos=1)
            async with asyncio.timeout(10):
                async for message in browser.messages:
                    assert message.payload == b"public"
                    break


def listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) of every TCP socket process `pid` listens on, read from the kernel."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


async def test_every_listener_of_a_private_mosquitto_is_on_loopback() -> None:
    """Mosquitto 2.0.11 binds a WebSocket listener given 127.0.0.1 on every address (the TCP one it
    binds right): the sockets themselves are read, not the configuration."""
    require_mosquitto()
    async with open_broker("auto") as info:
        assert info.pid is not None
        sockets = await asyncio.to_thread(listening, info.pid)
        assert {port for _, port in sockets} == {info.address.port, ws_port_of(info.ws_url)}, sockets
        assert {address for address, _ in sockets} <= LOOPBACK, sockets
        async with aiomqtt.Client("127.0.0.1", ws_port_of(info.ws_url), transport="websockets"):
            pass  # and a browser's way in still works on 127.0.0.1


async def test_every_listener_of_the_embedded_broker_is_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_module, "find_mosquitto", lambda: None)
    before = listening(os.getpid())
    async with open_broker("auto") as info:
        assert info.kind == "embedded"
        sockets = listening(os.getpid()) - before
        assert {port for _, port in sockets} >= {info.address.port}, sockets
        assert {address for address, _ in sockets} <= LOOPBACK, sockets
