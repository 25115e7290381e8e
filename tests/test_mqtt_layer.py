"""sim.mqtt without a broker: the address, its login and TLS options, redaction, the backoff."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sim.errors import ConfigError
from sim.mqtt import Backoff, BrokerAddress, ReconnectPolicy, TlsFiles, redact

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


def test_the_layer_exports_exactly_its_public_names() -> None:
    import sim.mqtt

    assert set(sim.mqtt.__all__) == {
        "ENV_PASSWORD", "ENV_USERNAME", "Backoff", "BrokerAddress", "ReconnectPolicy", "TlsFiles", "login_refused",
        "mqtt_error", "open_client", "redact", "stay_connected",
    }


def test_the_sans_io_modules_do_no_io() -> None:
    import ast

    import sim

    root = Path(sim.__file__).parent
    for name in ("routing.py", "mailbox.py", "bounds.py", "signing.py"):
        for node in ast.walk(ast.parse((root / name).read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                io = ("aiomqtt", "asyncio", "socket", "sim.bus", "sim.mqtt")
                assert not [m for m in modules if m.startswith(io)], (name, modules)
