"""The view's HTTP API on a real server on 127.0.0.1: live against Mosquitto, stored from a store file."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import httpx
import pytest

from sim.cli import main
from sim.errors import ConfigError
from sim.mqtt import BrokerAddress
from sim.runner import RunConfig, run
from sim.store import open_reader
from sim.view import LiveView, RunModel, StoredRun, ViewSource, build_app, open_view_server
from sim.wire import topics
from sim.wire.events import PlayerInputMessage
from tests.conftest import REPO, MosquittoProcess

VILLAGE = str(REPO / "scenarios" / "village.toml")


async def wait_for(what: str, probe: Any) -> Any:
    """Poll `probe` for up to a minute (generous: the machine is shared) until it gives something."""
    for _ in range(600):
        if value := await probe():
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
async def offline_view() -> AsyncIterator[tuple[str, list[tuple[str, PlayerInputMessage]]]]:
    """A live-mode view on a model fed by hand; `speak` records instead of publishing."""
    model = RunModel("r1")
    spoken: list[tuple[str, PlayerInputMessage]] = []

    async def speak(player: str, message: PlayerInputMessage) -> None:
        spoken.append((player, message))

    source = ViewSource(model=lambda _t: model, live=True, speak=speak)
    async with open_view_server(build_app(source), "127.0.0.1", 0) as url:
        yield url, spoken


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"not json", "say:"),
        (b'{"player": "ann", "to": "smith"}', "text"),
        (b'{"player": "", "to": "smith", "text": "hi"}', "player"),
        (b'{"player": "a/b", "to": "smith", "text": "hi"}', "player"),
        (b'{"player": "ann", "to": "smith", "text": ""}', "text"),
        (b'{"player": "ann", "to": "smith", "text": "hi", "as": "shard"}', "as"),
        (b'{"player": "ann", "to": "../x", "text": "hi"}', "to"),
        (b'{"player": "ann", "to": "smith", "text": "' + b"x" * 5000 + b'"}', "text"),
    ],
)
async def test_say_refuses_bad_input_with_one_line(
    offline_view: tuple[str, list[tuple[str, PlayerInputMessage]]], body: bytes, error: str
) -> None:
    url, spoken = offline_view
    async with httpx.AsyncClient(base_url=url) as client:
        response = await client.post("/api/say", content=body)
    assert response.status_code == 400
    message = response.json()["error"]
    assert error in message and "\n" not in message
    assert spoken == []


async def test_say_publishes_a_good_input_and_bad_queries_are_refused(
    offline_view: tuple[str, list[tuple[str, PlayerInputMessage]]],
) -> None:
    url, spoken = offline_view
    async with httpx.AsyncClient(base_url=url) as client:
        ok = await client.post("/api/say", json={"player": "ann", "to": "smith", "text": "Hello"})
        assert ok.status_code == 200
        assert spoken == [("ann", PlayerInputMessage(to="smith", text="Hello"))]
        bad = await client.get("/api/lines", params={"before": "yesterday"})
        assert bad.status_code == 400 and "before" in bad.json()["error"]
        missing = await client.get("/api/npc/nobody")
        assert missing.status_code == 404 and "nobody" in missing.json()["error"]
        for path in ("/static/..%2Fserver.py", "/static/.hidden.js", "/static/server.py", "/static/nothing.js"):
            assert (await client.get(path)).status_code == 404, path
        page = await client.get("/")
        assert page.status_code == 200 and "npcsim" in page.text
        assert (await client.get("/static/view.js")).status_code == 200
        icon = await client.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/x-icon"
        assert icon.content[:4] == b"\x00\x00\x01\x00"  # an ICO file


async def test_the_view_port_in_use_is_one_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = build_app(ViewSource(model=lambda _t: RunModel("r"), live=True))
        with pytest.raises(ConfigError, match=f"--port {port}"):
            async with open_view_server(app, "127.0.0.1", port):
                pass


@pytest.mark.mosquitto
async def test_live_view_follows_a_run_streams_and_speaks(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    config = RunConfig(scenario=VILLAGE, broker=mosquitto.url, run_id="lv", ticks=100_000, tick_ms=100, db=str(db))
    view = LiveView()
    stop, ready = asyncio.Event(), asyncio.Event()
    async with open_view_server(build_app(view.source()), "127.0.0.1", 0) as url, asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stop=stop, on_ready=lambda _s: ready.set()))
        await ready.wait()
        feed = group.create_task(view.follow(BrokerAddress.parse(mosquitto.url), "lv"))
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                async def world() -> Any:
                    state = (await client.get("/api/state")).json()
                    return state if len(state["world"]["names"]) == 4 and state["lines"] else None

                state = await wait_for("the world and a line", world)
                assert state["run"] == "lv" and state["world"]["state"]["king"]
                async with client.stream("GET", "/api/events") as stream:
                    first = await anext(aiter(stream.aiter_lines()))
                assert first.startswith("data: ") and '"health"' in first
                # a hostile client publishes junk on the trace topic: counted, nothing else changes
                async with aiomqtt.Client("127.0.0.1", mosquitto.port) as hostile:
                    await hostile.publish(topics.trace("lv", "9"), b"\x00junk", qos=1)
                refused = await wait_for("the junk counted", lambda: _refused(client))
                assert refused == 1
                said = await client.post("/api/say", json={"player": "web", "to": "innkeeper", "text": "Ale?"})
                assert said.status_code == 200

                async def answer() -> Any:
                    lines = (await client.get("/api/lines", params={"npc": "innkeeper"})).json()
                    return [x for x in lines if x["speaker"] == "innkeeper" and x["to"] == "web"]

                assert await wait_for("the innkeeper's answer", answer)
                unknown = await client.post("/api/say", json={"player": "web", "to": "dragon", "text": "Hi"})
                assert unknown.status_code == 400 and "dragon" in unknown.json()["error"]
        finally:
            stop.set()
        await job
        feed.cancel()
    assert view.model.health.inferences > 0


async def _refused(client: httpx.AsyncClient) -> int:
    return int((await client.get("/api/state")).json()["health"]["refused"])


@pytest.mark.mosquitto
async def test_stored_view_replays_a_finished_run_by_tick(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    db = tmp_path / "done.db"
    await run(RunConfig(scenario=VILLAGE, broker=mosquitto.url, run_id="st", ticks=12, db=str(db)))
    stored = StoredRun(db)
    source = ViewSource(model=stored.model, live=False, ticks=(stored.first_tick, stored.last_tick))
    with open_reader(db) as reader:
        summaries = reader.audit_summaries()
    async with open_view_server(build_app(source), "127.0.0.1", 0) as url, httpx.AsyncClient(base_url=url) as client:
        full = (await client.get("/api/state")).json()
        assert full["live"] is False and full["ticks"] == [stored.first_tick, stored.last_tick]
        assert full["health"]["inferences"] == len(summaries)
        early = (await client.get("/api/state", params={"tick": 3})).json()
        assert early["health"]["inferences"] == sum(1 for s in summaries if s.tick <= 3)
        assert all(line["tick"] <= 3 for line in early["lines"])
        last = summaries[-1]
        npc = (await client.get(f"/api/npc/{last.agent_id}")).json()
        assert npc["traces"][0]["inference_id"] == last.id or npc["traces"][0]["tick"] == last.tick
        refused = await client.post("/api/say", json={"player": "a", "to": last.agent_id, "text": "hi"})
        assert refused.status_code == 405
        assert (await client.get("/api/events")).status_code == 404


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["view"], "give --run ID"),
        (["view", "--broker", "http://x", "--run", "r"], "--broker 'http://x'"),
        (["view", "--db", "/nonexistent/file.db"], "--db '/nonexistent/file.db'"),
        (["view", "--db", "x.db", "--run", "r"], "--db"),
    ],
)
def test_view_command_refuses_bad_options(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv", [["view", "--db", "x", "--port", "99999"], ["run", "s.toml", "--view", "port"],
                                  ["view", "--broker", "mqtt://127.0.0.1:1", "--run", "a/b"],
                                  ["worker", "--broker", "mqtt://h:1", "--run", "r", "--metrics-port", "0"]])
def test_bad_ports_exit_2_naming_the_option(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and argv[-2] in err and argv[-1] in err


@pytest.mark.mosquitto
def test_run_with_view_prints_the_address_first_then_the_dialogue(
    mosquitto: MosquittoProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """`npcsim run --view PORT --follow` (what `make run` does), with the view on its own thread."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    seen: list[dict[str, Any]] = []

    def watch() -> None:
        for _ in range(600):
            try:
                state = httpx.get(f"http://127.0.0.1:{port}/api/state", timeout=10).json()
            except httpx.HTTPError:
                state = {}
            if state.get("lines"):
                seen.append(state)
                return
            threading.Event().wait(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        code = main(["run", VILLAGE, "--broker", mosquitto.url, "--run-id", "cli", "--ticks", "40", "--tick-ms", "100",
                     "--view", str(port), "--follow"])
    finally:
        watcher.join(timeout=90)
    captured = capsys.readouterr()
    assert code == 0
    assert captured.err.splitlines()[0].startswith(f"view: http://127.0.0.1:{port}/")  # where to look: stderr
    assert "cli t" in captured.out  # lines printed as they are said
    assert seen and seen[0]["run"] == "cli" and len(seen[0]["world"]["names"]) == 4
    with pytest.raises(httpx.HTTPError):  # the view stopped with the run
        httpx.get(f"http://127.0.0.1:{port}/api/state", timeout=5)


@pytest.mark.mosquitto
async def test_live_view_logs_in_as_viewer_on_the_shipped_acl(tmp_path: Path) -> None:
    """With auth.conf and the ACL: the viewer sees traces and the roster; a player's login sees no trace."""
    from tests.secured import secured_broker

    with secured_broker() as broker:
        config = RunConfig(scenario=VILLAGE, broker=broker.url_for("shard"), run_id="acl", ticks=100_000,
                           tick_ms=100)
        viewer, player = LiveView(), LiveView()
        stop, ready = asyncio.Event(), asyncio.Event()
        async with asyncio.TaskGroup() as group:
            job = group.create_task(run(config, stop=stop, on_ready=lambda _s: ready.set()))
            await ready.wait()
            feeds = [group.create_task(viewer.follow(BrokerAddress.parse(broker.url_for("viewer")), "acl")),
                     group.create_task(player.follow(BrokerAddress.parse(broker.url_for("alice")), "acl"))]
            try:
                async def both_see_lines() -> bool:
                    return viewer.model.health.inferences >= 3 and player.model.health.lines >= 3

                await wait_for("traces for the viewer, lines for the player", both_see_lines)
                assert len(viewer.model.npcs) == 4 and len(player.model.npcs) == 4  # the roster is public
                assert player.model.health.inferences == 0  # the trace is not
                speak = viewer.source().speak
                assert speak is not None
                await speak("viewer", PlayerInputMessage(to="innkeeper", text="Ale?"))  # allowed: its own name

                async def answered() -> bool:
                    return any(x.speaker == "innkeeper" and x.to == "viewer" for x in viewer.model.lines())

                await wait_for("the innkeeper's answer to the viewer", answered)
            finally:
                stop.set()
            await job
            for feed in feeds:
                feed.cancel()
