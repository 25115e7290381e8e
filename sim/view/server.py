"""The view's HTTP side (aiohttp): the static page, a JSON API and a server-sent event stream.

Why aiohttp: one well-kept library (aio-libs) gives the server, server-sent events and a
test client on the asyncio loop npcsim already runs, with no ASGI server in between.

Besides the page (`/`, `/static/*`, `/favicon.ico`), the API (JSON; `tick` only for a stored run):
    GET  /api/state?tick=T          run, mode, health, world, newest lines, tick range
    GET  /api/lines?before=&npc=&location=&limit=&tick=   older lines (paging), filtered
    GET  /api/npc/{id}?tick=T       the NPC's newest traces, the newest with its prompt
    GET  /api/compare/{id}?tick=T   with --compare: this store's and the other's working memory
                                    of the NPC side by side, what the other lost or gained marked
    GET  /api/events?after=SEQ      live only: one `data:` message per change, at most 4/s
    POST /api/say {to, text}        live only: published on `player/{player}/input`, where
                                    `player` is the operator's choice (`ViewSource.player`),
                                    never the request's; a refused publish is an error

Every request passes `sim.view.access` first (Host, login, and for `POST` the JSON type,
the Origin and the page's token); the page (`GET /`) carries its token and the player's
name in `<meta>` tags.

The stream sends the health, the new lines (newest 200 at most) and whether the world or
an NPC changed; the page fetches the rest when it needs it, so a 10,000-NPC run costs a
browser what it shows, not what happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import importlib.resources
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from sim.errors import ConfigError, NpcsimError
from sim.view.access import RequestLog, ViewAccess, add_security_headers, check_listening
from sim.view.model import RunModel
from sim.wire import topics
from sim.wire.decoding import json_reader
from sim.wire.events import MAX_TEXT_CHARS, PlayerInputMessage

__all__ = ["DEFAULT_PLAYER", "ViewSource", "build_app", "open_view_server"]

_STREAM_INTERVAL_S = 0.25
_MAX_LINES = 200
_JSON = msgspec.json.Encoder()
_STATIC = importlib.resources.files("sim.view") / "static"
_CONTENT_TYPES = {
    ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".ico": "image/x-icon",
}
_ACCESS = web.AppKey("access", ViewAccess)
_SAY = json_reader(PlayerInputMessage)

DEFAULT_PLAYER = "viewer"
"""The player a view speaks as unless its operator names another (the ACL's viewer speaks as it)."""

Speak = Callable[[str, PlayerInputMessage], Awaitable[None]]


class ViewSource(msgspec.Struct, frozen=True, kw_only=True):
    """Where the page's data comes from: a live model (with `speak`) or a stored run's models.

    `player` is who the page speaks as: the operator's choice, a name that is not an
    internal role's (`sim.wire.topics.check_player`). `compare` gives, for an NPC and a
    tick, two stores' working memories side by side (`sim.view.compare`).
    """

    model: Callable[[int | None], RunModel]
    live: bool
    speak: Speak | None = None
    ticks: tuple[int, int] | None = None
    player: str = DEFAULT_PLAYER
    compare: Callable[[str, int | None], dict[str, Any] | None] | None = None
    compare_name: str | None = None  # the other store's name, shown on the page


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_JSON.encode(data), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _int_param(request: web.Request, name: str) -> int | None:
    value = request.query.get(name, "")
    if value == "":
        return None
    try:
        return int(value)
    except ValueError:
        error = _JSON.encode({"error": f"{name}: expected a whole number, got {value[:100]!r}"}).decode()
        raise web.HTTPBadRequest(text=error, content_type="application/json") from None


def build_app(source: ViewSource, clock: Callable[[], float] = time.monotonic) -> web.Application:
    """The view's application; serve it with `open_view_server` (which says where it listens)."""
    try:
        topics.check_player(source.player)
    except ValueError as exc:
        raise ConfigError(f"--as-player: {exc}") from None
    access = ViewAccess()
    routes = web.RouteTableDef()
    page = (_STATIC / "index.html").read_text(encoding="utf-8")

    @routes.get("/")
    async def index(_: web.Request) -> web.Response:
        body = page.replace("__NPCSIM_TOKEN__", access.page_token()).replace(
            "__NPCSIM_PLAYER__", html.escape(source.player))
        return web.Response(text=body, content_type="text/html", headers={"Cache-Control": "no-store"})

    @routes.get("/favicon.ico")  # browsers ask for it on their own
    async def favicon(_: web.Request) -> web.Response:
        return web.Response(body=(_STATIC / "favicon.ico").read_bytes(), content_type="image/x-icon",
                            headers={"Cache-Control": "max-age=86400"})

    @routes.get("/static/{name}")
    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        suffix = name[name.rfind(".") :] if "." in name else ""
        item = _STATIC / name
        if "/" in name or name.startswith(".") or suffix not in _CONTENT_TYPES or not item.is_file():
            raise web.HTTPNotFound()
        return web.Response(body=item.read_bytes(), content_type=_CONTENT_TYPES[suffix])

    @routes.get("/api/state")
    async def state(request: web.Request) -> web.Response:
        model = source.model(_int_param(request, "tick"))
        return _json({
            "run": model.run,
            "live": source.live,
            "ticks": source.ticks,
            "health": model.health_view(clock()),
            "world": model.world_view(),
            "world_version": model.world_version,
            "lines": model.lines(limit=_MAX_LINES),
            "last_seq": model.last_seq,
            "compare": source.compare_name,
        })

    @routes.get("/api/lines")
    async def lines(request: web.Request) -> web.Response:
        model = source.model(_int_param(request, "tick"))
        limit = min(max(_int_param(request, "limit") or _MAX_LINES, 1), 1000)
        return _json(model.lines(
            before=_int_param(request, "before"), limit=limit,
            npc=request.query.get("npc", ""), location=request.query.get("location", ""),
        ))

    @routes.get("/api/npc/{agent}")
    async def npc(request: web.Request) -> web.Response:
        view = source.model(_int_param(request, "tick")).npc_view(request.match_info["agent"])
        if view is None:
            return _error(404, f"no NPC {request.match_info['agent']!r} in this run")
        return _json(view)

    @routes.get("/api/compare/{agent}")
    async def compare(request: web.Request) -> web.Response:
        if source.compare is None:
            return _error(404, "no store to compare with: npcsim view --db FILE --compare OTHER.db")
        agent = request.match_info["agent"]
        sides = source.compare(agent, _int_param(request, "tick"))
        if sides is None:
            return _error(404, f"no NPC {agent!r} in either store")
        return _json(sides)

    @routes.get("/api/events")
    async def events(request: web.Request) -> web.StreamResponse:
        if not source.live:
            return _error(404, "a stored run has no event stream")
        after = _int_param(request, "after")  # a bad value is a 400 before the stream starts
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        model = source.model(None)
        seen_version, seen_seq, seen_world = -1, model.last_seq if after is None else after, model.world_version
        with contextlib.suppress(ConnectionResetError):
            while True:
                if model.version != seen_version:
                    new = model.lines(after=seen_seq, limit=_MAX_LINES)
                    changed = sorted(a for a, v in model.npc_versions.items() if v > seen_version)
                    message = {
                        "health": model.health_view(clock()),
                        "lines": new,
                        "last_seq": model.last_seq,
                        "world_changed": model.world_version != seen_world,
                        "npcs_changed": changed if len(changed) <= 1000 else None,
                    }
                    seen_version, seen_seq, seen_world = model.version, model.last_seq, model.world_version
                    await response.write(b"data: " + _JSON.encode(message) + b"\n\n")
                await asyncio.sleep(_STREAM_INTERVAL_S)
        return response

    @routes.post("/api/say")
    async def say(request: web.Request) -> web.Response:
        if source.speak is None:
            return _error(405, "a stored run cannot be spoken to")
        try:
            message = _SAY.decode(await request.read())
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return _error(400, f"say: {exc} (the body is {{to, text}}; the player is the view's: {source.player})")
        if len(message.text) > MAX_TEXT_CHARS:  # more than any run takes (its own bound is at most this)
            return _error(400, f"say: text of {len(message.text)} characters, more than any run takes "
                               f"({MAX_TEXT_CHARS})")
        model = source.model(None)
        if model.npcs and message.to not in model.npcs:
            return _error(400, f"say: to {message.to!r}: no such NPC in run {model.run}")
        try:
            await source.speak(source.player, message)
        except NpcsimError as exc:
            return _error(503, str(exc))
        return _json({"ok": True, "player": source.player})

    app = web.Application(client_max_size=64 * 1024, middlewares=[access.middleware])
    app[_ACCESS] = access
    app.on_response_prepare.append(add_security_headers)
    app.add_routes(routes)
    return app


@contextlib.asynccontextmanager
async def open_view_server(
    app: web.Application, host: str, port: int, *, allow_remote: bool = False, password: str | None = None,
    public_url: str | None = None, option: str = "--port",
) -> AsyncIterator[str]:
    """Serve `app` on host:port (0: a free port); yields the page's URL, stops on exit.

    Beyond loopback only with `allow_remote` and a `password` (HTTP basic); `public_url` is
    the address browsers use when it is not host:port (a reverse proxy, a wildcard address).
    A port that cannot be had is a ConfigError naming `option`, the flag that gave it.
    """
    check_listening(host, allow_remote=allow_remote, password=password, public_url=public_url)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0,
                           logger=RequestLog(logging.getLogger("aiohttp.server")))
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"{option} {port}: cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        bound = runner.addresses[0][1]
        yield app[_ACCESS].bind(host, bound, public_url=public_url, password=password)
    finally:
        await runner.cleanup()
