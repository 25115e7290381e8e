"""sim.mqtt without a broker: the address, its login and TLS options, redaction, the backoff, the one layer."""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

import aiomqtt
import pytest

from sim.errors import BrokerError, ConfigError
from sim.mqtt import Backoff, BrokerAddress, ReconnectPolicy, TlsFiles, redact, stay_connected

SECRET = "s3cr%t:pw"


def test_url_login_port_and_scheme() -> None:
    a = BrokerAddress.parse("mqtt://shard:s3cr%25t%3Apw@broker.example:2883", env={})
    assert (a.host, a.port, a.tls, a.username, a.password) == ("broker.example", 2883, False, "shard", SECRET)
    assert BrokerAddress.parse("mqtt://h", env={}).port == 1883
    secure = BrokerAddress.parse("mqtts://h", env={})
    assert secure.port == 8883 and secure.tls and secure.url == "mqtts://h:8883"


def test_login_from_the_environment() -> None:
    env = {"NPCSIM_MQTT_USERNAME": "worker", "NPCSIM_MQTT_PASSWORD": "pw"}
    a = BrokerAddress.parse("mqtt://127.0.0.1:1883", env=env)
    assert (a.username, a.password) == ("worker", "pw")
    # the URL's user wins; its password may come from the environment
    b = BrokerAddress.parse("mqtt://alice@127.0.0.1:1883", env=env)
    assert (b.username, b.password) == ("alice", "pw")
    c = BrokerAddress.parse("mqtt://127.0.0.1", env={})
    assert c.username is None and c.password is None


@pytest.mark.parametrize(
    ("url", "env", "fragment"),
    [
        ("http://h:1883", {}, "expected mqtt://host:port"),
        ("localhost:1883", {}, "expected mqtt://host:port"),
        ("mqtt://:1883", {}, "expected mqtt://host:port"),
        ("mqtt://u:pw@h:notaport", {}, "bad port"),
        ("mqtt://u:pw@h:99999", {}, "bad port"),
        ("mqtt://h:1883/topic", {}, "unexpected path"),
        ("mqtt://:pw@h:1883", {}, "password without a user name"),
        ("mqtt://h", {"NPCSIM_MQTT_PASSWORD": "pw"}, "no user name"),
    ],
)
def test_bad_urls_are_one_clear_error_without_the_password(url: str, env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as caught:
        BrokerAddress.parse(url, env=env)
    assert "pw@" not in str(caught.value) and ":pw" not in str(caught.value)


def test_tls_files(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    a = BrokerAddress.parse("mqtts://h", env={}, tls=TlsFiles(ca_file=str(ca)))
    assert a.tls_files.ca_file == str(ca)
    with pytest.raises(ConfigError, match="need an mqtts:// URL"):
        BrokerAddress.parse("mqtt://h", env={}, tls=TlsFiles(ca_file=str(ca)))
    with pytest.raises(ConfigError, match="--cert-file needs --key-file"):
        BrokerAddress.parse("mqtts://h", env={}, tls=TlsFiles(cert_file=str(ca)))
    with pytest.raises(ConfigError, match=r"--ca-file .*no such file"):
        BrokerAddress.parse("mqtts://h", env={}, tls=TlsFiles(ca_file=str(tmp_path / "missing.pem")))


def test_the_password_never_shows() -> None:
    a = BrokerAddress.parse("mqtt://shard:hunter2@127.0.0.1:1883", env={})
    for text in (a.url, str(a), repr(a), f"{a}", repr(a.with_login("x", "hunter3"))):
        assert "hunter" not in text, text
    assert a.url == "mqtt://shard@127.0.0.1:1883"
    assert redact("lost mqtt://shard:hunter2@h:1 and mqtts://u:p@x") == "lost mqtt://shard:***@h:1 and mqtts://u:***@x"


def test_backoff_is_jittered_capped_and_starts_over_after_a_success() -> None:
    backoff = Backoff(ReconnectPolicy(initial=0.1, maximum=1.0), random.Random(7))
    waits = [backoff.next() for _ in range(8)]
    caps = [min(1.0, 0.1 * 2**n) for n in range(8)]
    assert all(cap / 2 <= w <= cap for w, cap in zip(waits, caps, strict=True))
    assert len(set(waits)) == len(waits)  # jittered
    backoff.reset()
    assert 0.05 <= backoff.next() <= 0.1


def test_the_sans_io_modules_do_no_io() -> None:
    import ast

    import sim

    root = Path(sim.__file__).parent
    for path in sorted([*(root / "protocol").glob("*.py"), *(root / "wire").glob("*.py")]):
        name = path.name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                io = ("aiomqtt", "asyncio", "socket", "sim.bus", "sim.mqtt")
                assert not [m for m in modules if m.startswith(io)], (name, modules)


def test_only_sim_mqtt_imports_the_mqtt_library() -> None:
    """One MQTT layer: every other module reaches a broker through sim.mqtt's Transport."""
    import ast

    import sim

    root = Path(sim.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.parent == root / "mqtt":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                found += [f"{path.relative_to(root)}: {m}" for m in modules if m.startswith(("aiomqtt", "paho"))]
    assert not found, found


class _FakeClient:
    """Stands in for aiomqtt.Client: fails to connect when told to."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    async def __aenter__(self) -> _FakeClient:
        if self.fail:
            raise aiomqtt.MqttError("[Errno 111] Connection refused")
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


async def test_stay_connected_logs_lost_and_back_once_and_backs_off_from_the_start_after_a_success(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    plan = [True, True, False, True, False]  # fail, fail, connect (then lost), fail, connect (then done)
    sessions = []
    delays: list[float] = []

    async def no_wait(delay: float) -> None:
        delays.append(delay)

    monkeypatch.setattr(asyncio, "sleep", no_wait)  # the backoff's waits, recorded

    async def session(client: object) -> None:
        sessions.append(client)
        if len(sessions) == 1:
            raise aiomqtt.MqttError("Disconnected during message iteration")

    address = BrokerAddress.parse("mqtt://shard:hunter2@127.0.0.1:1", env={})
    await stay_connected(address, session, name="t", policy=ReconnectPolicy(initial=1.0, maximum=100.0),
                         connect=lambda: _FakeClient(plan.pop(0)))  # type: ignore[arg-type, return-value]
    assert len(sessions) == 2
    assert 0.5 <= delays[0] <= 1 and 1 <= delays[1] <= 2  # growing...
    assert 0.5 <= delays[2] <= 1 and 1 <= delays[3] <= 2  # ...and from the start again after the success
    assert caplog.text.count("cannot be made") == 1 and caplog.text.count(" lost ") == 1
    assert caplog.text.count("is back") == 1 and "hunter2" not in caplog.text


async def test_a_publish_lost_with_its_connection_is_a_lost_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session that lets a link's failed publish out is connected again, as after any loss."""
    from sim.mqtt._connection import LinkLost

    async def no_wait(delay: float) -> None:
        return None

    monkeypatch.setattr(asyncio, "sleep", no_wait)
    sessions = []

    async def session(client: object) -> None:
        sessions.append(client)
        if len(sessions) == 1:
            raise LinkLost("t/x", aiomqtt.MqttError("Disconnected"))

    address = BrokerAddress.parse("mqtt://127.0.0.1:1", env={})
    await stay_connected(address, session, name="t", policy=ReconnectPolicy(),
                         connect=lambda: _FakeClient(False))  # type: ignore[arg-type, return-value]
    assert len(sessions) == 2


async def test_stay_connected_gives_up_after_its_patience_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter(range(0, 100, 3))

    async def no_wait(delay: float) -> None:
        return None

    monkeypatch.setattr(asyncio, "sleep", no_wait)  # the backoff's waits, recorded

    async def session(client: object) -> None:
        raise AssertionError("never connects")

    address = BrokerAddress.parse("mqtt://127.0.0.1:1", env={})
    with pytest.raises(BrokerError, match=r"^t: no MQTT connection to mqtt://127.0.0.1:1 for 5 s"):
        await stay_connected(address, session, name="t", policy=ReconnectPolicy(patience=5),
                             connect=lambda: _FakeClient(True),  # type: ignore[arg-type, return-value]
                             clock=lambda: float(next(now)))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["subscribe", "--broker", "http://h:1"], "--broker"),
        (["worker", "--broker", "mqtt://u:hunter2@h:x", "--run", "r"], "bad port"),
        (["subscribe", "--broker", "mqtts://h:1", "--ca-file", "/nonexistent/ca.pem"], "--ca-file"),
        (["subscribe", "--broker", "mqtts://h:1", "--key-file", "/etc/hostname"], "--key-file needs --cert-file"),
        (["run", "scenarios/village.toml", "--set", "broker.tls.ca_file=/etc/hostname", "--quiet"],
         "not to --broker auto"),
        (["loadtest", "--broker", "mqtt://u:hunter2@h:x"], "--broker"),
    ],
)
def test_bad_broker_options_are_one_line_and_exit_2(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sim.cli import main
    from tests.helpers import REPO

    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) if argv[0] == "loadtest" else contextlib.nullcontext():
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "hunter2" not in err
    assert fragment in err.splitlines()[-1]  # one line (argparse puts its usage above)
