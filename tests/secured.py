"""A real Mosquitto with the shipped broker-config/auth.conf and acl, passwords made here.

Mosquitto started as root drops to the user `mosquitto`, so its password file and ACL live
in a directory anyone may enter (mode 0755) and are readable (0644); the directory is
removed afterwards. Passwords are made with `mosquitto_passwd`, one per role or player.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import BROKER_CONFIG, IN_CI, MosquittoProcess, require_mosquitto

ROLES = ("shard", "worker", "game", "viewer", "alice", "bob")


def password(user: str) -> str:
    return f"{user}-Pw-7f3a9"


class SecuredBroker(MosquittoProcess):
    def url_for(self, user: str) -> str:
        return f"mqtt://{user}:{password(user)}@127.0.0.1:{self.port}"

    def env_for(self, user: str) -> dict[str, str]:
        return {"NPCSIM_MQTT_USERNAME": user, "NPCSIM_MQTT_PASSWORD": password(user)}


@contextmanager
def secured_broker() -> Iterator[SecuredBroker]:
    binary = require_mosquitto()
    passwd = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    if not Path(passwd).exists():
        if IN_CI:
            pytest.fail("mosquitto_passwd is not installed, and CI=true")
        pytest.skip("mosquitto_passwd is not installed")
    directory = Path(tempfile.mkdtemp(prefix="npcsim-secured-"))
    try:
        directory.chmod(0o755)
        passwords = directory / "passwords"
        passwords.touch()
        for user in ROLES:
            subprocess.run([passwd, "-b", str(passwords), user, password(user)], check=True, timeout=30,
                           capture_output=True)
        acl = directory / "acl"
        shutil.copy(BROKER_CONFIG / "acl", acl)
        for path in (passwords, acl):
            path.chmod(0o644)
        broker = SecuredBroker(binary, directory, config="auth.conf")
        body = broker.config_path.read_text()
        body = body.replace("broker-config/passwords", str(passwords)).replace("broker-config/acl", str(acl))
        broker.config_path.write_text(body)
        broker.config_path.chmod(0o644)
        broker.start()
        try:
            yield broker
        finally:
            broker.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
