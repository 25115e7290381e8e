"""Who may use the view (sim.view.access), over real HTTP on 127.0.0.1: one test per rule.

The cross-origin attacks in a real browser are in tests/test_view_browser.py; the view's
speaking refused by the shipped ACL is here, against a real Mosquitto.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sim.cli import main
from sim.errors import BrokerError, ConfigError
from sim.mqtt import BrokerAddress, Link, MqttTransport, ReconnectPolicy
from sim.view import LiveView, RunModel, ViewSource, build_app, open_view_server
from sim.view.access import SECURITY_HEADERS
from sim.wire.events import PlayerInputMessage
from tests.helpers import eventually, free_port
from tests.view_client import Spoken, page_meta, say

STATIC = Path(__file__).resolve().parent.parent / "sim" / "view" / "static"


def offline_source(spoken: Spoken, *, player: str = "viewer") -> ViewSource:
    model = RunModel("r1")

    async def speak(who: str, message: PlayerInputMessage) -> None:
        spoken.append((who, message))

    return ViewSource(model=lambda _t: model, live=True, speak=speak, player=player)


@pytest.fixture
async def view() -> AsyncIterator[tuple[httpx.AsyncClient, Spoken]]:
    spoken: Spoken = []
    async with open_view_server(build_app(offline_source(spoken)), "127.0.0.1", 0) as url, \
            httpx.AsyncClient(base_url=url) as client:
        yield client, spoken


async def test_the_page_carries_a_fresh_token_and_the_operators_player(view: tuple[httpx.AsyncClient, Spoken]) -> None:
    client, _ = view
    first, second = [page_meta((await client.get("/")).text) for _ in range(2)]
    assert first["player"] == "viewer" and first["token"] != second["token"]
    assert (await client.get("/")).headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize(
    ("content_type", "content"),
    [
        ("text/plain", b'{"to": "smith", "text": "hi", "x": "="}'),  # what a cross-origin form can send
        ("application/x-www-form-urlencoded", b"to=smith&text=hi"),
        ("multipart/form-data; boundary=b", b'--b\r\nContent-Disposition: form-data; name="to"\r\n\r\nsmith\r\n--b--'),
        ("", b'{"to": "smith", "text": "hi"}'),
    ],
)
async def test_say_takes_json_only(view: tuple[httpx.AsyncClient, Spoken], content_type: str, content: bytes) -> None:
    client, spoken = view
    response = await say(client, None, content=content, content_type=content_type)
    assert response.status_code == 415 and "application/json" in response.json()["error"]
    assert spoken == []


@pytest.mark.parametrize(
    "origin", ["", "null", "http://evil.example", "http://127.0.0.1:1", "http://localhost.evil.example"],
)
async def test_say_takes_the_views_own_origin_only(view: tuple[httpx.AsyncClient, Spoken], origin: str) -> None:
    client, spoken = view
    response = await say(client, {"to": "smith", "text": "hi"}, origin=origin)
    assert response.status_code == 403 and "Origin" in response.json()["error"]
    assert spoken == []


@pytest.mark.parametrize("token", ["", "forged", "abc.0123456789abcdef0123456789abcdef", "."])
async def test_say_takes_a_token_this_view_served_only(view: tuple[httpx.AsyncClient, Spoken], token: str) -> None:
    client, spoken = view
    response = await say(client, {"to": "smith", "text": "hi"}, token=token)
    assert response.status_code == 403 and "X-Npcsim-Token" in response.json()["error"]
    assert spoken == []


async def test_a_token_of_another_view_is_refused() -> None:
    spoken: Spoken = []
    async with open_view_server(build_app(offline_source([])), "127.0.0.1", 0) as other_url, \
            open_view_server(build_app(offline_source(spoken)), "127.0.0.1", 0) as url, \
            httpx.AsyncClient(base_url=other_url) as other, httpx.AsyncClient(base_url=url) as client:
        token = page_meta((await other.get("/")).text)["token"]
        assert (await say(client, {"to": "smith", "text": "hi"}, token=token)).status_code == 403
        assert (await say(client, {"to": "smith", "text": "hi"})).status_code == 200
    assert len(spoken) == 1


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "127.0.0.1", "127.0.0.1:1", "", "[::2]:{port}"],
)
async def test_every_request_needs_the_views_own_host(view: tuple[httpx.AsyncClient, Spoken], host: str) -> None:
    """DNS rebinding: a page on another name that resolves to 127.0.0.1 reads and speaks nothing."""
    client, spoken = view
    port = client.base_url.port
    for path in ("/", "/api/state", "/static/view.js", "/api/npc/smith", "/nothing"):
        response = await client.get(path, headers={"Host": host.format(port=port)})
        assert response.status_code == 421 and "Host" in response.json()["error"], path
    token = page_meta((await client.get("/")).text)["token"]
    foreign = host.format(port=port)
    spoken_as = await client.post("/api/say", json={"to": "smith", "text": "hi"},
                                  headers={"Host": foreign, "Origin": f"http://{foreign}", "X-Npcsim-Token": token})
    assert spoken_as.status_code == 421 and spoken == []
    for alias in (f"localhost:{port}", f"LOCALHOST:{port}", f"127.0.0.1:{port}"):
        assert (await client.get("/api/state", headers={"Host": alias})).status_code == 200, alias


async def test_security_headers_on_every_response(view: tuple[httpx.AsyncClient, Spoken]) -> None:
    client, _ = view
    port = client.base_url.port
    responses = [await client.get(path) for path in ("/", "/static/view.js", "/static/view.css", "/api/state",
                                                    "/api/npc/nobody", "/nothing", "/api/lines?before=x")]
    responses.append(await client.get("/", headers={"Host": "evil.example"}))
    responses.append(await client.post("/api/say", content=b"x", headers={"Content-Type": "text/plain"}))
    responses.append(await client.request("OPTIONS", "/api/say", headers={"Origin": "http://evil.example"}))
    async with client.stream("GET", "/api/events") as stream:
        responses.append(stream)
    assert {r.status_code for r in responses} >= {200, 400, 404, 405, 415, 421}
    for response in responses:
        for name, value in SECURITY_HEADERS.items():
            assert response.headers.get(name) == value, (response.url, name)
        assert "access-control-allow-origin" not in response.headers
    csp = SECURITY_HEADERS["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert port


def test_the_page_needs_no_inline_script() -> None:
    """The CSP allows scripts from the view only: the page has none inline and no handler attributes."""
    page = (STATIC / "index.html").read_text()
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.DOTALL)
    assert scripts and all(attributes.strip().startswith("src=") and not body for attributes, body in scripts)
    assert not re.search(r"\son[a-z]+\s*=", page, re.IGNORECASE) and "style=" not in page
    script = (STATIC / "view.js").read_text()
    assert "innerHTML" not in script and "eval(" not in script and "setAttribute(\"style" not in script


async def test_events_after_a_bad_value_is_a_400(view: tuple[httpx.AsyncClient, Spoken]) -> None:
    client, _ = view
    for value in ("abc", "1.5", "0x10"):
        response = await client.get("/api/events", params={"after": value})
        assert response.status_code == 400 and "after" in response.json()["error"], value
    async with client.stream("GET", "/api/events", params={"after": "0"}) as stream:
        assert stream.status_code == 200
        assert (await anext(aiter(stream.aiter_lines()))).startswith("data: ")


async def test_a_login_is_asked_for_when_the_view_has_a_password() -> None:
    spoken: Spoken = []
    async with open_view_server(build_app(offline_source(spoken)), "127.0.0.1", 0, password="s3cret") as url, \
            httpx.AsyncClient(base_url=url) as client:
        refused = await client.get("/")
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic ")
        wrong = base64.b64encode(b"me:nope").decode()
        assert (await client.get("/", headers={"Authorization": f"Basic {wrong}"})).status_code == 401
        assert (await client.get("/", headers={"Authorization": "Basic !!!"})).status_code == 401
        client.auth = httpx.BasicAuth("anyone", "s3cret")
        assert (await client.get("/api/state")).status_code == 200
        assert (await say(client, {"to": "smith", "text": "hi"})).status_code == 200
    assert len(spoken) == 1


@pytest.mark.parametrize(
    ("host", "options", "needle"),
    [
        ("0.0.0.0", {}, "--host 0.0.0.0: the view listens beyond loopback only with --allow-remote"),
        ("192.0.2.1", {}, "--allow-remote"),
        ("myhost.example", {}, "--allow-remote"),
        ("0.0.0.0", {"allow_remote": True}, "--allow-remote: set NPCSIM_VIEW_PASSWORD"),
        ("0.0.0.0", {"allow_remote": True, "password": "pw"}, "--public-url"),
        ("127.0.0.1", {"public_url": "ftp://x/"}, "--public-url 'ftp://x/'"),
    ],
)
async def test_listening_beyond_loopback_needs_allow_remote_and_a_login(
    host: str, options: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        async with open_view_server(build_app(offline_source([])), host, 0, **options):  # type: ignore[arg-type]
            pass
    assert needle in str(refused.value) and "\n" not in str(refused.value)


async def test_allowed_remote_with_a_login_answers_on_its_public_address() -> None:
    """--allow-remote, a password and --public-url: the public name's Host and Origin, with the login."""
    spoken: Spoken = []
    port = free_port()
    async with open_view_server(build_app(offline_source(spoken)), "0.0.0.0", port, allow_remote=True,
                                password="pw", public_url="http://npc.test:8080/") as url, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        assert url == "http://npc.test:8080/"
        public = {"Host": "npc.test:8080"}
        assert (await client.get("/api/state", headers=public)).status_code == 401
        client.auth = httpx.BasicAuth("viewer", "pw")
        assert (await client.get("/api/state", headers=public)).status_code == 200
        assert (await client.get("/api/state")).status_code == 200  # it listens on loopback too
        assert (await client.get("/api/state", headers={"Host": f"evil.example:{port}"})).status_code == 421
        token = page_meta((await client.get("/", headers=public)).text)["token"]
        said = await client.post("/api/say", json={"to": "smith", "text": "hi"},
                                 headers={**public, "Origin": "http://npc.test:8080", "X-Npcsim-Token": token})
        assert said.status_code == 200
    assert len(spoken) == 1


async def test_behind_a_reverse_proxy_the_public_host_and_origin_are_the_views() -> None:
    """On loopback behind a proxy (docs/operations.md): the proxy's https name in Host and Origin."""
    spoken: Spoken = []
    port = free_port()
    async with open_view_server(build_app(offline_source(spoken)), "127.0.0.1", port,
                                public_url="https://npc.example.org/") as url, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        assert url == "https://npc.example.org/"
        proxied = {"Host": "npc.example.org"}
        page = await client.get("/", headers=proxied)
        assert page.status_code == 200
        token = page_meta(page.text)["token"]
        for origin, status in (("https://npc.example.org", 200), ("http://npc.example.org", 403)):
            said = await client.post("/api/say", json={"to": "smith", "text": "hi"},
                                     headers={**proxied, "Origin": origin, "X-Npcsim-Token": token})
            assert said.status_code == status, origin  # http is another origin than https
    assert len(spoken) == 1


async def test_a_malformed_http_request_is_one_log_line(
    view: tuple[httpx.AsyncClient, Spoken], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = view
    port = client.base_url.port
    assert port is not None
    requests = [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"\x16\x03\x01\x02\x00\x01",
                b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]
    with caplog.at_level(logging.DEBUG, logger="aiohttp"):
        for n, raw in enumerate(requests, 1):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            await writer.drain()
            answer = await reader.read(100)
            writer.close()
            await writer.wait_closed()
            assert answer.startswith(b"HTTP/1.") and b" 400 " in answer
            await eventually(_logged(caplog, n), what="the log line")
    lines = [r for r in caplog.records if r.name.startswith("aiohttp")]
    assert len(lines) == len(requests)
    for record in lines:
        assert record.exc_info is None and record.levelno == logging.WARNING
        assert "\n" not in record.getMessage() and "malformed request (400" in record.getMessage()


def _logged(caplog: pytest.LogCaptureFixture, n: int) -> object:
    async def probe() -> bool:
        return len([r for r in caplog.records if r.name.startswith("aiohttp")]) >= n

    return probe


@pytest.mark.parametrize("name", ["shard", "worker", "game", "a/b", "", "x" * 129, "bob\n", "bob smith"])
def test_the_view_never_speaks_as_a_role_or_a_non_name(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--as-player"):
        build_app(offline_source([], player=name))
    for argv in (["view", "--db", "x.db", "--as-player", name],
                 ["run", "village", "--view", "8080", "--as-player", name]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "--as-player" in err and "Traceback" not in err


def test_view_refuses_to_listen_beyond_loopback_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NPCSIM_VIEW_PASSWORD", raising=False)
    for argv, needle in ((["--host", "0.0.0.0"], "--allow-remote"),
                         (["--host", "0.0.0.0", "--allow-remote"], "NPCSIM_VIEW_PASSWORD")):
        assert main(["view", "--broker", "mqtt://127.0.0.1:1", "--run", "r", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err


@pytest.mark.mosquitto
async def test_a_publish_the_broker_refuses_is_an_error_not_ok() -> None:
    """On the shipped ACL the viewer login speaks as player `viewer` only: as anyone else, /api/say fails."""
    from tests.secured import secured_broker

    with secured_broker() as broker:
        alice = BrokerAddress(host="127.0.0.1", port=broker.port, username="alice", password="alice-Pw-7f3a9")

        async def speak(link: Link) -> None:
            await link.publish("npcsim/r/player/alice/input", b"{}", qos=1, retain=False)  # her own: taken
            with pytest.raises(BrokerError, match="refused the publish on npcsim/r/player/bob/input: Not authorized"):
                await link.publish("npcsim/r/player/bob/input", b"{}", qos=1, retain=False)

        await MqttTransport(alice, name="test", policy=ReconnectPolicy(patience=30), check_refusals=True).run(speak)
        for player, status in (("bob", 503), ("viewer", 200)):
            view = LiveView("acl", player=player)
            async with open_view_server(build_app(view.source()), "127.0.0.1", 0) as url, \
                    httpx.AsyncClient(base_url=url) as client, asyncio.TaskGroup() as group:
                feed = group.create_task(view.follow(BrokerAddress.parse(broker.url_for("viewer")), "acl"))

                async def answered() -> httpx.Response | None:
                    response = await say(client, {"to": "innkeeper", "text": "hi"})
                    return None if "not connected" in response.text else response

                response = await eventually(answered, what="a connected view", within=60)
                feed.cancel()
            assert response.status_code == status, response.text
            if status != 200:
                assert "refused" in response.json()["error"] and "player/bob/input" in response.json()["error"]
