"""Shared fixtures: hypothesis profiles and a real Mosquitto on a free loopback port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from sim.mqtt import BrokerAddress

REPO = Path(__file__).resolve().parent.parent
BROKER_CONFIG = REPO / "broker-config"
IN_CI = os.environ.get("CI", "").lower() == "true"

settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile(
    "ci", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("ci" if IN_CI else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_mosquitto() -> str:
    """The mosquitto binary; skipped locally without it, a failure in CI."""
    path = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None
    )
    if path is None:
        if IN_CI:
            pytest.fail("mosquitto is not installed, and CI=true: tests that need it must run")
        pytest.skip("mosquitto is not installed")
    return path


class MosquittoProcess:
    """A private Mosquitto from broker-config/ that a test can stop and start again."""

    def __init__(self, binary: str, workdir: Path, config: str = "dev.conf") -> None:
        self.binary = binary
        self.port = free_port()
        self.config_path = workdir / f"mosquitto-{self.port}.conf"
        body = (BROKER_CONFIG / config).read_text()
        self.config_path.write_text(f"listener {self.port} 127.0.0.1\n{body}")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress(host="127.0.0.1", port=self.port)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.config_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                self.stop()
                raise RuntimeError(f"mosquitto exited at start: {err}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on port {self.port} within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoProcess]:
    """A running private Mosquitto for one test; stopped however the test ends."""
    broker = MosquittoProcess(require_mosquitto(), tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
