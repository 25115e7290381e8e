"""The view's HTTP API on a real server on 127.0.0.1: live against Mosquitto, stored from a store file."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiomqtt
import httpx
import pytest

from sim.cli import main
from sim.errors import ConfigError
from sim.mqtt import BrokerAddress
from sim.shard import BrokerConfig, RecordConfig, RunConfig, run
from sim.store import open_reader
from sim.view import LiveView, RunModel, StoredRun, ViewSource, build_app, open_view_server
from sim.wire import topics
from sim.wire.events import PlayerInputMessage
from tests.helpers import VILLAGE, MosquittoProcess, eventually, eventually_sync, npcsim_in_process
from tests.view_client import Spoken, say

VIEW_S = 60.0  # how long the view may take to show something (generous: the machine is shared)


@pytest.fixture
async def offline_view() -> AsyncIterator[tuple[str, Spoken]]:
    """A live-mode view on a model fed by hand; `speak` records instead of publishing."""
    model = RunModel("r1")
    spoken: Spoken = []

    async def speak(player: str, message: PlayerInputMessage) -> None:
        spoken.append((player, message))

    source = ViewSource(model=lambda _t: model, live=True, speak=speak)
    async with open_view_server(build_app(source), "127.0.0.1", 0) as url:
        yield url, spoken


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"not json", "say:"),
        (b'{"to": "smith"}', "text"),
        (b'{"to": "smith", "text": ""}', "text"),
        (b'{"player": "ann", "to": "smith", "text": "hi"}', "player"),  # the player is the view's, never the page's
        (b'{"to": "smith", "text": "hi", "as": "shard"}', "as"),
        (b'{"to": "../x", "text": "hi"}', "to"),
        (b'{"to": "smith", "text": "' + b"x" * 5000 + b'"}', "text"),
    ],
)
async def test_say_refuses_bad_input_with_one_line(offline_view: tuple[str, Spoken], body: bytes, error: str) -> None:
    url, spoken = offline_view
    async with httpx.AsyncClient(base_url=url) as client:
        response = await say(client, None, content=body)
    assert response.status_code == 400
    message = response.json()["error"]
    assert error in message and "\n" not in message
    assert spoken == []


async def test_say_publishes_a_good_input_and_bad_queries_are_refused(offline_view: tuple[str, Spoken]) -> None:
    url, spoken = offline_view
    async with httpx.AsyncClient(base_url=url) as client:
        ok = await say(client, {"to": "smith", "text": "Hello"})
        assert ok.status_code == 200 and ok.json() == {"ok": True, "player": "viewer"}
        assert spoken == [("viewer", PlayerInputMessage(to="smith", text="Hello"))]
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
    config = RunConfig(
        scenario=VILLAGE, run_id="lv", ticks=100_000, tick_ms=100, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    )
    view = LiveView(player="web")
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

                state = await eventually(world, what="the world and a line", within=VIEW_S, every=0.1)
                assert state["run"] == "lv" and state["world"]["state"]["king"]
                async with client.stream("GET", "/api/events") as stream:
                    first = await anext(aiter(stream.aiter_lines()))
                assert first.startswith("data: ") and '"health"' in first
                # a hostile client publishes junk on the trace topic: counted, nothing else changes
                async with aiomqtt.Client("127.0.0.1", mosquitto.port) as hostile:
                    await hostile.publish(topics.trace("lv", "9"), b"\x00junk", qos=1)
                malformed = await eventually(lambda: _malformed(client), what="the junk counted", within=VIEW_S,
                                             every=0.1)
                assert malformed == 1
                # a player's input the run refuses: the view counts it by its code
                async with aiomqtt.Client("127.0.0.1", mosquitto.port) as player:
                    await player.publish(topics.player_input("lv", "loud"), json.dumps(
                        {"to": "innkeeper", "text": "A" * 600, "id": "q9"}).encode(), qos=1)

                async def refused() -> Any:
                    health = (await client.get("/api/state")).json()["health"]
                    return health if health["refused"] else None

                health = await eventually(refused, what="the refusal counted", within=VIEW_S, every=0.1)
                assert health["refused_codes"] == {"too_long": 1} and health["malformed"] == 1
                said = await say(client, {"to": "innkeeper", "text": "Ale?"})
                assert said.status_code == 200

                async def answer() -> Any:
                    lines = (await client.get("/api/lines", params={"npc": "innkeeper"})).json()
                    return [x for x in lines if x["speaker"] == "innkeeper" and x["to"] == "web"]

                assert await eventually(answer, what="the innkeeper's answer", within=VIEW_S, every=0.1)
                unknown = await say(client, {"to": "dragon", "text": "Hi"})
                assert unknown.status_code == 400 and "dragon" in unknown.json()["error"]
        finally:
            stop.set()
        await job
        feed.cancel()
    assert view.model.health.inferences > 0


async def _malformed(client: httpx.AsyncClient) -> int:
    return int((await client.get("/api/state")).json()["health"]["malformed"])


@pytest.mark.mosquitto
async def test_stored_view_replays_a_finished_run_by_tick(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    db = tmp_path / "done.db"
    await run(RunConfig(
        scenario=VILLAGE, run_id="st", ticks=12, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    ))
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
        refused = await say(client, {"to": last.agent_id, "text": "hi"})
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
    ran = npcsim_in_process(capsys, *argv)
    assert ran.code == 2
    assert needle in ran.err and len(ran.err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["view", "--db", "x", "--port", "99999"], ["run", "s.toml", "--view", "port"],
                                  ["view", "--broker", "mqtt://127.0.0.1:1", "--run", "a/b"],
                                  ["worker", "--broker", "mqtt://h:1", "--run", "r", "--metrics-port", "0"]])
def test_bad_ports_exit_2_naming_the_option(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    ran = npcsim_in_process(capsys, *argv)
    assert ran.code == 2
    assert "Traceback" not in ran.err and argv[-2] in ran.err and argv[-1] in ran.err


@pytest.mark.mosquitto
def test_run_with_view_prints_the_address_first_then_the_dialogue(
    mosquitto: MosquittoProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """`npcsim run --view PORT --follow` (what `make run` does), with the view on its own thread."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def state_with_lines() -> dict[str, Any] | None:
        try:
            state: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/api/state", timeout=10).json()
        except httpx.HTTPError:
            return None
        return state if state.get("lines") else None

    with ThreadPoolExecutor(max_workers=1) as watcher:  # the run blocks this thread: the page is watched beside it
        seen = watcher.submit(eventually_sync, state_with_lines, what="the view showing lines", within=VIEW_S,
                              every=0.1)
        code = main(["run", VILLAGE, "--broker", mosquitto.url, "--run-id", "cli", "--ticks", "40", "--tick-ms", "100",
                     "--view", str(port), "--follow"])
        state = seen.result(timeout=90)
    captured = capsys.readouterr()
    assert code == 0
    assert captured.err.splitlines()[0].startswith(f"view: http://127.0.0.1:{port}/")  # where to look: stderr
    assert "cli t" in captured.out  # lines printed as they are said
    assert state["run"] == "cli" and len(state["world"]["names"]) == 4
    with pytest.raises(httpx.HTTPError):  # the view stopped with the run
        httpx.get(f"http://127.0.0.1:{port}/api/state", timeout=5)


@pytest.mark.mosquitto
async def test_live_view_logs_in_as_viewer_on_the_shipped_acl(tmp_path: Path) -> None:
    """With auth.conf and the ACL: the viewer sees traces and the roster; a player's login sees no trace."""
    from tests.secured import secured_broker

    with secured_broker() as broker:
        config = RunConfig(
            scenario=VILLAGE, run_id="acl", ticks=100_000, tick_ms=100,
            broker=BrokerConfig(url=broker.url_for("shard")),
        )
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

                await eventually(both_see_lines, what="traces for the viewer, lines for the player", within=VIEW_S)
                assert len(viewer.model.npcs) == 4 and len(player.model.npcs) == 4  # the roster is public
                assert player.model.health.inferences == 0  # the trace is not
                speak = viewer.source().speak
                assert speak is not None
                await speak("viewer", PlayerInputMessage(to="innkeeper", text="Ale?"))  # allowed: its own name

                async def answered() -> bool:
                    return any(x.speaker == "innkeeper" and x.to == "viewer" for x in viewer.model.lines())

                await eventually(answered, what="the innkeeper's answer to the viewer", within=VIEW_S)
            finally:
                stop.set()
            await job
            for feed in feeds:
                feed.cancel()
