"""A server's address as npcsim uses it: the options of each server a `base_url` names, and
the URL as a record or a log line may show it (without its user and password)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sim.errors import ConfigError

__all__ = ["each_server", "shown_url"]


def each_server(options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One server's options for each of `base_url`'s URLs (a string or a list of them)."""
    urls = options.get("base_url")
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, list | tuple) or not urls or not all(isinstance(u, str) for u in urls):
        raise ConfigError(f"backend 'openai' options: base_url must be a URL or a list of URLs, got {urls!r}")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"backend 'openai' options: base_url names a server twice: {urls!r}")
    return [{**options, "base_url": url} for url in urls]


def shown_url(url: str) -> str:
    """The URL without its user and password: what a record and a log line may say."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
