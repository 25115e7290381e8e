"""The broker address: one value parsed once from a URL, the environment and TLS flags.

    address = BrokerAddress.parse("mqtts://broker.example:8883", env=os.environ,
                                  tls=TlsFiles(ca_file="ca.pem"))
    address.url        # "mqtts://broker.example:8883": safe to print, never holds a password

The user part of the URL gives the login (`mqtt://shard:secret@host:1883`, percent-encoded
when needed). Without one, `NPCSIM_MQTT_USERNAME` and `NPCSIM_MQTT_PASSWORD` give it, so
that a password need not appear in a process list or a shell history; a URL with a user
name but no password takes the password from `NPCSIM_MQTT_PASSWORD`. The password is kept
out of `url`, `str()`, `repr()` and every error this module raises.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit

import msgspec

from sim.errors import ConfigError

__all__ = ["ENV_PASSWORD", "ENV_USERNAME", "BrokerAddress", "TlsFiles", "redact"]

ENV_USERNAME = "NPCSIM_MQTT_USERNAME"
ENV_PASSWORD = "NPCSIM_MQTT_PASSWORD"
_DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}
_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:@/\s]*):[^@/\s]*@", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the password of every `scheme://user:password@` in it replaced by `***`."""
    return _USERINFO.sub(r"\g<scheme>\g<user>:***@", text)


class TlsFiles(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """TLS material for `mqtts://`: a CA bundle, and a client certificate with its key."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def check(self) -> None:
        """Each named file exists, and a certificate comes with its key (and back)."""
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = ("--cert-file", "--key-file") if self.key_file is None else ("--key-file", "--cert-file")
            raise ConfigError(f"{given} needs {missing} too")
        for option, path in (("--ca-file", self.ca_file), ("--cert-file", self.cert_file),
                             ("--key-file", self.key_file)):
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{option} {path!r}: no such file")

    @property
    def any(self) -> bool:
        return any(p is not None for p in (self.ca_file, self.cert_file, self.key_file))


class BrokerAddress(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where a client connects and how it logs in. Build it with `BrokerAddress.parse`."""

    host: str = "127.0.0.1"
    port: int = 1883
    tls: bool = False
    username: str | None = None
    password: str | None = None
    tls_files: TlsFiles = msgspec.field(default_factory=TlsFiles)

    @classmethod
    def parse(
        cls, url: str, *, env: Mapping[str, str] | None = None, tls: TlsFiles | None = None
    ) -> BrokerAddress:
        """Parse `mqtt[s]://[user[:password]@]host[:port]`; a ConfigError names the (redacted) URL.

        `env` defaults to `os.environ`; pass `{}` to ignore the environment.
        """
        env = os.environ if env is None else env
        tls = tls or TlsFiles()
        shown = redact(url)
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ConfigError(f"--broker {shown!r}: bad port") from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ConfigError(f"--broker {shown!r}: expected mqtt://host:port or mqtts://host:port")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ConfigError(f"--broker {shown!r}: unexpected path, query or fragment")
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        if username is None:
            if password is not None:
                raise ConfigError(f"--broker {shown!r}: a password without a user name")
            username = env.get(ENV_USERNAME) or None
        if username is not None and password is None:
            password = env.get(ENV_PASSWORD) or None
        elif username is None and env.get(ENV_PASSWORD):
            raise ConfigError(f"{ENV_PASSWORD} is set but no user name is given (URL or {ENV_USERNAME})")
        if tls.any and scheme != "mqtts":
            raise ConfigError(f"--broker {shown!r}: --ca-file/--cert-file/--key-file need an mqtts:// URL")
        tls.check()
        return cls(
            host=parts.hostname, port=port or _DEFAULT_PORTS[scheme], tls=scheme == "mqtts",
            username=username, password=password, tls_files=tls,
        )

    def with_login(self, username: str | None, password: str | None) -> BrokerAddress:
        """The same broker with another login (a role's generated credentials)."""
        return msgspec.structs.replace(self, username=username, password=password)

    @property
    def url(self) -> str:
        """The address as a URL that is safe to print: the user name, never the password."""
        scheme = "mqtts" if self.tls else "mqtt"
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{user}{host}:{self.port}"

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        secret = "***" if self.password else None
        return f"BrokerAddress(url={self.url!r}, password={secret!r}, tls_files={self.tls_files!r})"
