"""Which broker a shard talks to: `--broker auto` or `--broker mqtt[s]://...`.

    async with open_broker("auto") as broker:
        broker.address          # the shard's login (sim.mqtt.BrokerAddress)
        broker.worker           # the remote workers' login
        broker.viewer           # a read-only login for watchers, when npcsim started the broker
        broker.game             # the game system's login, when npcsim started the broker
        broker.url              # printable: never holds a password
        broker.ws_url           # ws://127.0.0.1:PORT: MQTT over WebSockets, when npcsim started the broker

`auto` starts a private Mosquitto child on a free loopback port when `mosquitto` is on
PATH. It is private by default: it installs the shipped ACL (broker-config/acl) with a
password file holding fresh random passwords for the roles `shard`, `worker`, `viewer` and
`game`, so that an anonymous local client can at most read the public topics and publish
player input. The viewer's login is the one a run hands out to watchers (`npcsim subscribe`
and `npcsim view` find it, sim.attach): it reads, and publishes only as player `viewer`; the
game system's is handed to the game (sim.attach keeps it in a file of the user's). The
broker's files live in a directory of their own that is removed as soon as Mosquitto has read them
(it reads them once at start), so nothing is left behind even after `kill -9` of the run.

The child is stopped on every exit path of the context manager (normal exit, exception,
cancellation by SIGINT/SIGTERM in the shard process that opened it, sim.shard). It gets its
own process group and a parent-death signal, so a SIGKILLed shard does not leave it behind
either: Mosquitto started as root would drop to the user `mosquitto`, and that change of identity clears the
parent-death signal, so it is told to run as the user that started it (the same privilege
as the run itself, no more). Without Mosquitto an embedded amqtt broker runs in-process: it
speaks MQTT 3.1.1 only, has no shared subscriptions and no ACL, so the bus falls back to
3.1.1, remote workers cannot share requests through it and the run warns that anyone on it
can forge internal events.

Both kinds of private broker also listen for MQTT over WebSockets on loopback (`ws_port`, or
a free port), with the same logins and ACL as the MQTT port: what a browser client connects
to (examples/web, docs/integrate.md).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import hashlib
import logging
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sim.errors import BrokerError, ConfigError
from sim.mqtt import BrokerAddress, TlsFiles
from sim.resources import broker_config_dir

__all__ = ["BROKER_CONFIG", "BrokerInfo", "find_mosquitto", "free_port", "mosquitto_password_line", "open_broker"]

log = logging.getLogger(__name__)

BROKER_CONFIG = broker_config_dir()
_START_TIMEOUT = 10.0


@dataclass(frozen=True)
class BrokerInfo:
    """The broker a run uses, with the logins of its roles.

    `acl` is True when npcsim knows the broker enforces the shipped ACL (its own private
    Mosquitto); for an external broker it cannot know, and for the embedded one it is False.
    `viewer` is the login watchers of a broker npcsim started attach with (read-only on the
    private Mosquitto; no login on the embedded broker); None for an external broker.
    `game` is the game system's login on such a broker (world state, game events and facts,
    players' presence): the one login a game's own process needs besides the players'.
    `ws_url` is the private broker's MQTT-over-WebSockets address; None for an external one.
    """

    address: BrokerAddress
    worker: BrokerAddress
    protocol: Literal[5, 311]
    kind: Literal["mosquitto", "embedded", "external"]
    pid: int | None = None
    acl: bool = False
    viewer: BrokerAddress | None = None
    game: BrokerAddress | None = None
    ws_url: str | None = None

    @property
    def url(self) -> str:
        return self.address.url


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_mosquitto() -> str | None:
    """The mosquitto binary: on PATH, or in the sbin directories distributions use."""
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None
    )


def mosquitto_password_line(user: str, password: str) -> str:
    """A password-file line as `mosquitto_passwd` writes it (PBKDF2-SHA512, format $7$)."""
    salt = secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, 101)
    return f"{user}:$7$101${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}\n"


@asynccontextmanager
async def open_broker(
    spec: str, *, tls: TlsFiles | None = None, env: Mapping[str, str] | None = None, ws_port: int | None = None
) -> AsyncIterator[BrokerInfo]:
    """`auto` -> a private broker for the lifetime of the context; a URL -> that broker.

    For a URL, the login comes from the URL or the environment (sim.mqtt.BrokerAddress) and
    serves both the shard and its remote workers. `ws_port` is the private broker's
    WebSocket port (None: a free one); an external broker's listeners are its own.
    """
    if spec != "auto" and ws_port is not None:
        raise ConfigError("broker.ws_port applies to --broker auto: an external broker's WebSocket listener is its own")
    if spec != "auto":
        address = BrokerAddress.parse(spec, env=env, tls=tls)
        yield BrokerInfo(address=address, worker=address, protocol=5, kind="external")
        return
    if tls is not None and tls.any:
        raise ConfigError("broker.tls (the CA, certificate and key files) applies to an mqtts:// broker, "
                          "not to --broker auto")
    if ws_port is not None:
        _check_free(ws_port)
    ws = free_port() if ws_port is None else ws_port
    port = _other_free_port(ws)
    binary = find_mosquitto()
    if binary is not None:
        async with _mosquitto(binary, port, ws, ws_asked=ws_port is not None) as info:
            yield info
    else:
        async with _embedded(port, ws) as info:
            yield info


def _check_free(port: int) -> None:
    """broker.ws_port's port is free on loopback (else the broker would fail, or a start-up check
    could take whoever holds it for the broker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as brokers bind: a closed port's TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(f"broker.ws_port {port}: 127.0.0.1:{port} is taken ({exc.strerror})") from None


def _other_free_port(taken: int) -> int:
    """A free loopback port other than `taken` (a port just closed may be handed out again)."""
    while (port := free_port()) == taken:
        pass
    return port


def _die_with_parent(parent: int) -> Callable[[], None]:
    """In the child: own process group, and SIGTERM when the parent dies (Linux)."""

    def setup() -> None:
        os.setpgid(0, 0)
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)

    return setup


def _private_files(directory: Path, port: int, ws_port: int | None, logins: dict[str, str]) -> Path:
    """Write the config, the password file and the ACL for a private Mosquitto; returns the config.

    The WebSocket listener (None: none) shares the logins and the ACL: Mosquitto's settings
    are global unless `per_listener_settings` is on, and the shipped files leave it off.
    """
    passwords = directory / "passwords"
    passwords.write_text("".join(mosquitto_password_line(user, pw) for user, pw in logins.items()))
    acl = directory / "acl"
    acl.write_text((BROKER_CONFIG / "acl").read_text())
    config = directory / "mosquitto.conf"
    body = (BROKER_CONFIG / "dev.conf").read_text()
    websockets = "" if ws_port is None else f"listener {ws_port} {loopback_interface()}\nprotocol websockets\n"
    config.write_text(
        f"listener {port} 127.0.0.1\n{websockets}{body}\n"
        f"# private: generated logins for the shard, worker, viewer and game roles, the shipped ACL\n"
        f"password_file {passwords}\nacl_file {acl}\nuser {pwd.getpwuid(os.geteuid()).pw_name}\n"
    )
    for path in (passwords, acl, config):
        path.chmod(0o600)
    return config


def loopback_interface() -> str:
    """Where a private Mosquitto's WebSocket listener binds: the loopback interface's name.

    Mosquitto hands a WebSocket listener's address to libwebsockets, which binds an interface,
    not an IP address: Mosquitto 2.0.11 ignores `listener PORT 127.0.0.1` there and listens on
    every address. An interface name is honoured by every 2.0 release. Without a loopback
    interface named so (not Linux), the address is the best that can be said.
    """
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return "lo" if "lo" in names else "127.0.0.1"


_NO_WEBSOCKETS = "Websockets support not available"  # what a Mosquitto built without them says at start


@asynccontextmanager
async def _mosquitto(binary: str, port: int, ws_port: int, *, ws_asked: bool) -> AsyncIterator[BrokerInfo]:
    """A private Mosquitto; one built without WebSockets runs without them, unless `ws_asked`."""
    logins = {role: secrets.token_urlsafe(24) for role in ("shard", "worker", "viewer", "game")}
    ws: int | None = ws_port
    with tempfile.TemporaryDirectory(prefix="npcsim-broker-") as directory:
        try:
            proc = await _start_mosquitto(binary, _private_files(Path(directory), port, ws, logins), port, ws)
        except BrokerError as exc:
            if ws_asked or _NO_WEBSOCKETS not in str(exc):
                raise
            log.warning("this mosquitto (%s) has no WebSocket support: the run has no ws:// address for "
                        "browser clients (--broker mqtt://... to a broker with one serves them)", binary)
            ws = None
            proc = await _start_mosquitto(binary, _private_files(Path(directory), port, ws, logins), port, ws)
    # Mosquitto has read its files: they are gone before the run starts.
    try:
        log.info("started mosquitto (pid %d) on 127.0.0.1:%d%s", proc.pid, port,
                 "" if ws is None else f", WebSockets on {ws}")
        local = BrokerAddress(host="127.0.0.1", port=port)
        yield BrokerInfo(
            address=local.with_login("shard", logins["shard"]),
            worker=local.with_login("worker", logins["worker"]),
            protocol=5, kind="mosquitto", pid=proc.pid, acl=True,
            viewer=local.with_login("viewer", logins["viewer"]), game=local.with_login("game", logins["game"]),
            ws_url=None if ws is None else _ws_url(ws),
        )
    finally:
        await asyncio.shield(_stop(proc))


async def _start_mosquitto(binary: str, config: Path, port: int, ws_port: int | None) -> asyncio.subprocess.Process:
    """Mosquitto on `config`, once it listens on its ports; stopped again if it does not."""
    proc = await asyncio.create_subprocess_exec(
        binary,
        "-c",
        str(config),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_die_with_parent(os.getpid()),
    )
    try:
        for listening in (port, ws_port):
            if listening is not None:
                await _wait_listening(proc, listening)
    except BaseException:
        await asyncio.shield(_stop(proc))
        raise
    return proc


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


def _ws_url(port: int) -> str:
    return f"ws://127.0.0.1:{port}"


@asynccontextmanager
async def _embedded(port: int, ws_port: int) -> AsyncIterator[BrokerInfo]:
    try:
        from amqtt.broker import Broker
    except ImportError as exc:
        raise BrokerError(
            "--broker auto: mosquitto is not on PATH and the embedded broker is not installed; "
            "install mosquitto, or `pip install 'npcsim[embedded-broker]'`"
        ) from exc
    log.warning(
        "mosquitto not found: using the embedded amqtt broker on 127.0.0.1:%d (WebSockets on %d). It speaks "
        "MQTT 3.1.1 only (no MQTT 5 properties) and has no shared subscriptions ($share/...), so remote workers "
        "cannot share requests; fine for development, use Mosquitto or EMQX for anything else",
        port,
        ws_port,
    )
    broker = Broker(
        {
            "listeners": {
                "default": {"type": "tcp", "bind": f"127.0.0.1:{port}", "max_connections": 1000},
                "websocket": {"type": "ws", "bind": f"127.0.0.1:{ws_port}", "max_connections": 1000},
            },
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
    )
    try:
        await broker.start()
    except Exception as exc:  # amqtt raises its own and OS errors alike at start
        raise BrokerError(
            f"the embedded amqtt broker did not start on 127.0.0.1:{port} (WebSockets {ws_port}): {exc}"
        ) from exc
    try:
        address = BrokerAddress(host="127.0.0.1", port=port)
        yield BrokerInfo(address=address, worker=address, protocol=311, kind="embedded", viewer=address,
                         game=address, ws_url=_ws_url(ws_port))
    finally:
        await asyncio.shield(broker.shutdown())
