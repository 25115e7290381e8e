"""Speaking to the web view as its own page does (JSON, its Origin, a served page's token)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from sim.view import TOKEN_HEADER
from sim.wire.events import PlayerInputMessage

Spoken = list[tuple[str, PlayerInputMessage]]
META = re.compile(r'<meta name="npcsim-(token|player)" content="([^"]*)">')


def page_meta(page: str) -> dict[str, str]:
    """The token and the player name the page was served with."""
    return dict(META.findall(page))


async def say(client: httpx.AsyncClient, body: Any, *, origin: str | None = None, token: str | None = None,
              content: bytes | None = None, content_type: str = "application/json") -> httpx.Response:
    """POST /api/say as the view's own page does: JSON, its Origin, the token of a page it served."""
    if token is None:
        token = page_meta((await client.get("/")).text)["token"]
    headers = {"Content-Type": content_type, "Origin": str(client.base_url).rstrip("/") if origin is None else origin,
               TOKEN_HEADER: token}
    data = content if content is not None else json.dumps(body).encode()
    return await client.post("/api/say", content=data, headers=headers)
