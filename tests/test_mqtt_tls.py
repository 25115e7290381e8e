"""mqtts:// on a real Mosquitto with a test CA made by openssl: --ca-file verifies the broker."""

from __future__ import annotations

import gc
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest

from sim.errors import BrokerError
from sim.mqtt import BrokerAddress, ReconnectPolicy, TlsFiles, open_client, stay_connected
from tests.helpers import MosquittoProcess, require_mosquitto

pytestmark = pytest.mark.mosquitto


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "1", "-subj", f"/CN={name}", cwd=directory)


@pytest.fixture
def tls_broker() -> Iterator[tuple[MosquittoProcess, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    binary = require_mosquitto()
    directory = Path(tempfile.mkdtemp(prefix="npcsim-tls-"))
    try:
        directory.chmod(0o755)  # Mosquitto started as root reads these as user `mosquitto`
        _make_ca(directory, "ca")
        _make_ca(directory, "other-ca")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                 "-subj", "/CN=127.0.0.1", cwd=directory)
        (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", "server.crt", "-days", "1", "-extfile", "san.ext", cwd=directory)
        for path in directory.iterdir():
            path.chmod(0o644)
        broker = MosquittoProcess(binary, directory)
        broker.config_path.write_text(
            f"listener {broker.port} 127.0.0.1\ncertfile {directory / 'server.crt'}\n"
            f"keyfile {directory / 'server.key'}\nallow_anonymous true\npersistence false\n"
        )
        broker.config_path.chmod(0o644)
        broker.start()
        try:
            yield broker, directory
        finally:
            broker.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# paho leaves the socket of a failed TLS handshake to the garbage collector.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_mqtts_with_the_right_ca_round_trips_and_a_wrong_ca_is_refused(
    tls_broker: tuple[MosquittoProcess, Path],
) -> None:
    broker, directory = tls_broker
    url = f"mqtts://127.0.0.1:{broker.port}"
    good = BrokerAddress.parse(url, env={}, tls=TlsFiles(ca_file=str(directory / "ca.crt")))
    async with open_client(good) as client:
        await client.subscribe("npcsim/t/agent/a/say", qos=1)
        await client.publish("npcsim/t/agent/a/say", b"over tls", qos=1)
        async for message in client.messages:
            assert message.payload == b"over tls"
            break
    wrong = BrokerAddress.parse(url, env={}, tls=TlsFiles(ca_file=str(directory / "other-ca.crt")))
    with pytest.raises(aiomqtt.MqttError):
        async with open_client(wrong):
            pass

    async def never(client: aiomqtt.Client) -> None:
        raise AssertionError("connected with the wrong CA")

    with pytest.raises(BrokerError, match="did not accept the certificate"):
        await stay_connected(wrong, never, name="t", policy=ReconnectPolicy(initial=0.01, patience=30))
    gc.collect()  # collect the leaked sockets here, where the warning is expected
