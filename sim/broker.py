"""Which broker a shard talks to: `--broker auto` or `--broker mqtt://host:port`.

    async with open_broker("auto", workdir) as broker:
        broker.url, broker.protocol      # "mqtt://127.0.0.1:PORT", 5 (or 311 for amqtt)

`auto` starts a private Mosquitto child from broker-config/dev.conf on a free loopback
port when `mosquitto` is on PATH; the child is stopped on every exit path of the context
manager (normal exit, exception, cancellation by SIGINT/SIGTERM in the runner), and it
is started in its own process group with a parent-death signal where the platform has
one, so a SIGKILLed shard does not leave it behind either. Without Mosquitto an embedded
amqtt broker runs in-process: it speaks MQTT 3.1.1 only and has no shared subscriptions,
so the bus falls back to 3.1.1 and remote workers cannot share requests through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sim.bus import parse_url
from sim.errors import BrokerError
from sim.resources import broker_config_dir

__all__ = ["BROKER_CONFIG", "BrokerInfo", "find_mosquitto", "free_port", "open_broker"]

log = logging.getLogger(__name__)

BROKER_CONFIG = broker_config_dir()
_START_TIMEOUT = 10.0


@dataclass(frozen=True)
class BrokerInfo:
    url: str
    protocol: Literal[5, 311]
    kind: Literal["mosquitto", "embedded", "external"]
    pid: int | None = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_mosquitto() -> str | None:
    """The mosquitto binary: on PATH, or in the sbin directories distributions use."""
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None
    )


@asynccontextmanager
async def open_broker(spec: str, workdir: Path) -> AsyncIterator[BrokerInfo]:
    """`auto` -> a private broker for the lifetime of the context; a URL -> that broker."""
    if spec != "auto":
        parse_url(spec)
        yield BrokerInfo(url=spec, protocol=5, kind="external")
        return
    binary = find_mosquitto()
    if binary is not None:
        async with _mosquitto(binary, workdir) as info:
            yield info
    else:
        async with _embedded() as info:
            yield info


def _die_with_parent() -> None:
    """In the child: own process group, and SIGTERM when the parent dies (Linux)."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@asynccontextmanager
async def _mosquitto(binary: str, workdir: Path) -> AsyncIterator[BrokerInfo]:
    port = free_port()
    config = workdir / f"mosquitto-{port}.conf"
    body = (BROKER_CONFIG / "dev.conf").read_text()
    config.write_text(f"listener {port} 127.0.0.1\n{body}")
    proc = await asyncio.create_subprocess_exec(
        binary,
        "-c",
        str(config),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_die_with_parent,
    )
    try:
        await _wait_listening(proc, port)
        log.info("started mosquitto (pid %d) on 127.0.0.1:%d", proc.pid, port)
        yield BrokerInfo(url=f"mqtt://127.0.0.1:{port}", protocol=5, kind="mosquitto", pid=proc.pid)
    finally:
        await asyncio.shield(_stop(proc))
        config.unlink(missing_ok=True)


async def _wait_listening(proc: asyncio.subprocess.Process, port: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _START_TIMEOUT
    while loop.time() < deadline:
        if proc.returncode is not None:
            err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
            raise BrokerError(f"mosquitto exited at start (code {proc.returncode}): {err.strip()}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise BrokerError(f"mosquitto did not listen on 127.0.0.1:{port} within {_START_TIMEOUT:.0f} s")


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            async with asyncio.timeout(5):
                await proc.wait()
        except TimeoutError:
            log.warning("mosquitto (pid %d) ignored SIGTERM; killing it", proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.stderr is not None:
        proc.stderr.feed_eof()
    log.info("stopped mosquitto (pid %d)", proc.pid)


@asynccontextmanager
async def _embedded() -> AsyncIterator[BrokerInfo]:
    try:
        from amqtt.broker import Broker
    except ImportError as exc:
        raise BrokerError(
            "--broker auto: mosquitto is not on PATH and the embedded broker is not installed; "
            "install mosquitto, or `pip install 'npcsim[embedded-broker]'`"
        ) from exc
    port = free_port()
    log.warning(
        "mosquitto not found: using the embedded amqtt broker on 127.0.0.1:%d. It speaks MQTT 3.1.1 only "
        "(no MQTT 5 properties) and has no shared subscriptions ($share/...), so remote workers cannot "
        "share requests; fine for development, use Mosquitto or EMQX for anything else",
        port,
    )
    broker = Broker(
        {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}", "max_connections": 1000}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
    )
    try:
        await broker.start()
    except Exception as exc:  # amqtt raises its own and OS errors alike at start
        raise BrokerError(f"the embedded amqtt broker did not start on 127.0.0.1:{port}: {exc}") from exc
    try:
        yield BrokerInfo(url=f"mqtt://127.0.0.1:{port}", protocol=311, kind="embedded")
    finally:
        await asyncio.shield(broker.shutdown())
