"""Who may use the view, checked on every request (docs/operations.md, "The web view").

The view is a client of the run like any other, reachable by every web page its operator
opens. So, on every request:

- `Host` must name the address the view is reached by (its bound address, the loopback
  names when it listens there, or the `public_url` browsers use: a reverse proxy's, or a
  name for a wildcard address): a page on another name that resolves to the view (DNS
  rebinding) is refused (421);
- with a password (`NPCSIM_VIEW_PASSWORD`), an HTTP basic login (any user name) is
  required (401);
- a request that changes state (anything but GET, HEAD, OPTIONS: `POST /api/say`) must be
  `application/json` (415), come from the view's own `Origin` (403) and carry the page's
  token in `X-Npcsim-Token` (403). A page on another origin can send neither the header nor
  a JSON body without the browser asking first (a CORS preflight, which the view never
  grants), and cannot read the token out of the view's page;
- every response carries the security headers (`SECURITY_HEADERS`): a Content Security
  Policy without inline script, no framing, no MIME sniffing, no referrer.

Each page gets its own token, an HMAC of a fresh nonce under a key made when the app is
built: any token this view handed out is good, none can be guessed. A refused request is
one log line at INFO; a malformed HTTP request (aiohttp's parser refuses it) one line at
WARNING, not a traceback (`RequestLog`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec
from aiohttp import BasicAuth, web
from aiohttp.http_exceptions import HttpProcessingError

from sim.errors import ConfigError

__all__ = [
    "ENV_PASSWORD",
    "SECURITY_HEADERS",
    "TOKEN_HEADER",
    "RequestLog",
    "ViewAccess",
    "add_security_headers",
    "check_listening",
]

log = logging.getLogger(__name__)

ENV_PASSWORD = "NPCSIM_VIEW_PASSWORD"
TOKEN_HEADER = "X-Npcsim-Token"
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})
_JSON = msgspec.json.Encoder()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _netloc(host: str, port: int | None, scheme: str = "http") -> str:
    """`host[:port]` as a browser writes it in Host and Origin (no port when it is the default)."""
    shown = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    return shown.lower() if port in (None, default) else f"{shown.lower()}:{port}"


def check_listening(host: str, *, allow_remote: bool, password: str | None, public_url: str | None) -> None:
    """Refuse, in one line, to listen beyond loopback without `allow_remote` and a login."""
    if _is_loopback(host):
        return
    if not allow_remote:
        raise ConfigError(f"--host {host}: the view listens beyond loopback only with --allow-remote "
                          f"(and a login: {ENV_PASSWORD})")
    if not password:
        raise ConfigError(f"--allow-remote: set {ENV_PASSWORD}, the view's login, or keep the view on loopback "
                          "behind a reverse proxy that logs users in (docs/operations.md, Security)")
    if host in _WILDCARDS and public_url is None:
        raise ConfigError(f"--host {host!r} listens on every address: give --public-url, the address browsers "
                          "use (http://NAME:PORT/), which every request's Host and Origin are checked against")


class ViewAccess:
    """The view's checks (see the module's docstring); `bind` says where it listens."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._hosts: frozenset[str] = frozenset()
        self._origins: frozenset[str] = frozenset()
        self._password: bytes | None = None
        self.url = ""

    def bind(self, host: str, port: int, *, public_url: str | None = None, password: str | None = None) -> str:
        """Accept the Host and Origin of `host:port` (and of `public_url`); returns the page's URL."""
        # on loopback, or on every address (loopback included): the loopback names too
        names = {"localhost", "127.0.0.1", "::1"} if _is_loopback(host) or host in _WILDCARDS else set()
        if host not in _WILDCARDS:
            names.add(host)
        hosts = {_netloc(name, port) for name in names}
        origins = {f"http://{netloc}" for netloc in hosts}
        self.url = f"http://{_netloc(host, port)}/"
        if public_url is not None:
            scheme, netloc = _public(public_url)
            hosts.add(netloc)
            origins.add(f"{scheme}://{netloc}")
            self.url = f"{scheme}://{netloc}/"
        self._hosts, self._origins = frozenset(hosts), frozenset(origins)
        self._password = password.encode() if password else None
        return self.url

    def page_token(self) -> str:
        """A fresh token for one page."""
        nonce = secrets.token_urlsafe(12)
        return f"{nonce}.{self._tag(nonce)}"

    def _tag(self, nonce: str) -> str:
        return hmac.new(self._key, nonce.encode(), hashlib.sha256).hexdigest()[:32]

    def _token_ok(self, token: str) -> bool:
        nonce, _, tag = token.partition(".")
        return bool(nonce) and hmac.compare_digest(tag.encode(), self._tag(nonce).encode())

    def _login_ok(self, header: str) -> bool:
        if self._password is None:
            return True
        try:
            login = BasicAuth.decode(header)
        except ValueError:
            return False
        return hmac.compare_digest(login.password.encode(), self._password)

    def refusal(self, request: web.Request) -> tuple[int, str] | None:
        """Why `request` is refused, as (HTTP status, reason), or None."""
        host = request.headers.get("Host", "").lower()
        if host not in self._hosts:
            return 421, f"Host {host[:100]!r} is not this view's address ({self.url})"
        if not self._login_ok(request.headers.get("Authorization", "")):
            return 401, "a login is required"
        if request.method in _SAFE_METHODS:
            return None
        if request.content_type != "application/json":
            return 415, f"{request.method} takes application/json, not {request.content_type!r}"
        origin = request.headers.get("Origin", "")
        if origin.lower() not in self._origins:
            return 403, f"Origin {origin[:100]!r} is not this view's ({self.url})"
        if not self._token_ok(request.headers.get(TOKEN_HEADER, "")):
            return 403, f"no valid {TOKEN_HEADER} (the token of a page this view served)"
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self.refusal(request)
        if refused is None:
            return await handler(request)
        status, why = refused
        log.info("view: refused %s %r from %s: %s", request.method, request.path[:200], request.remote, why)
        headers = {"WWW-Authenticate": 'Basic realm="npcsim view", charset="UTF-8"'} if status == 401 else None
        return web.Response(body=_JSON.encode({"error": why}), status=status, headers=headers,
                            content_type="application/json")


def _public(url: str) -> tuple[str, str]:
    """(scheme, netloc) of a --public-url, or a ConfigError naming it."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or parts.username:
        raise ConfigError(f"--public-url {url!r}: expected http(s)://NAME[:PORT]/, the address browsers use")
    return parts.scheme, _netloc(parts.hostname, port, parts.scheme)


async def add_security_headers(_: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: the security headers on every response the app gives."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


class RequestLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log with a malformed request as one WARNING line instead of a traceback.

    Given to aiohttp's request handler as its `logger`; anything else (a failure in a
    handler: a bug) is logged as aiohttp logs it, traceback included.
    """

    def log(self, level: int, msg: object, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1] if exc_info else None
        if isinstance(error, HttpProcessingError):
            said = str(msg) % args if args else str(msg)
            reason = " ".join(str(error.message).split()).rstrip(" ^")[:200]
            self.logger.warning("view: %s: malformed request (%d %s)", said, error.code, reason)
            return
        super().log(level, msg, *args, exc_info=exc_info, **kwargs)
