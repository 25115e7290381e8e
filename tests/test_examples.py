"""The example clients (examples/web, examples/python) against real runs and a real Mosquitto.

The page runs in headless Chromium (tests/browser.py) from its file, with the mqtt.js
bundle that `make web-example` copies beside it; the Python game runs as a user runs it.
Each asks a live `npcsim run` and must show the answer. Against a broker where the test
plays the run, each must match an answer by `reply_to` (never another player's question
with the same id), else by NPC and player, show the run's errors, and treat hostile
payloads as text (the page) or count them (both).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiomqtt
import pytest

from sim import broker as broker_module
from sim.broker import open_broker
from tests.browser import click, css, on_page
from tests.helpers import IN_CI, REPO, VILLAGE, MosquittoProcess, Ran, ended, env_for, read_until, start_npcsim

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]

WEB = REPO / "examples" / "web"
GAME = REPO / "examples" / "python" / "game.py"
R = "npcsim/r"
QUESTION_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@pytest.fixture
def page() -> Path:
    """The page, once its mqtt.js is beside it."""
    if not (WEB / "vendor" / "mqtt.min.js").exists():
        if IN_CI:
            pytest.fail("examples/web/vendor/mqtt.min.js is missing, and CI=true: `make test` makes it first")
        pytest.skip("examples/web/vendor/mqtt.min.js is missing: run `make web-example` (Node 20 and npm)")
    return WEB / "index.html"


def page_url(page: Path, broker: str, run: str, player: str) -> str:
    return f"{page.as_uri()}?{urlencode({'broker': broker, 'run': run, 'player': player})}"


async def ask_on_page(browser: Any, npc: str, text: str) -> None:
    def ask() -> None:
        browser.find_element("id", "question").send_keys(text)
        browser.find_element("id", "send").click()

    await on_page("the Ask button", lambda: browser.find_element("id", "send").is_enabled())
    await click(browser, f"{npc} in the list", f'#npcs li[data-npc="{npc}"]')
    await asyncio.to_thread(ask)


def texts(browser: Any, selector: str) -> list[str]:
    return [e.text for e in css(browser, selector)]


async def test_the_page_asks_a_live_run_and_shows_the_answer(browser: Any, page: Path, tmp_path: Path) -> None:
    proc = await start_npcsim("run", VILLAGE, "--ticks", "100000", "--tick-ms", "100", env=env_for(tmp_path),
                              stdout=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stderr is not None
        printed = await read_until(proc.stderr, b"attach: web clients: ", within=60)
        found = re.search(rb"attach: web clients: (ws://127\.0\.0\.1:\d+) ", printed)
        assert found, printed
        url = page_url(page, found.group(1).decode(), "village-7", "tester")
        await asyncio.to_thread(browser.get, url)
        await on_page("the roster's four NPCs", lambda: len(css(browser, "#npcs li")) == 4)
        for npc, question in (("innkeeper", "A room for the night?"), ("blacksmith", "Can you mend a sword?")):
            await ask_on_page(browser, npc, question)
            await on_page(f"the {npc}'s answer",
                          lambda npc=npc: css(browser, f'#questions li.answered[data-npc="{npc}"] .answer'))
        answers = texts(browser, "#questions li.answered .answer")
        assert [a.split(":")[0] for a in answers] == ["blacksmith", "innkeeper"], answers
        assert texts(browser, "#errors li") == []

        # Past the page's own limit (a client that skips it): the run refuses it, and says so.
        await asyncio.to_thread(browser.execute_script,
                                "document.getElementById('question').removeAttribute('maxlength')")
        await ask_on_page(browser, "innkeeper", "x" * 600)
        problem = await on_page("the run's error", lambda: texts(browser, "#questions li.failed .problem"))
        assert problem[0].startswith("too_long: "), problem
        assert texts(browser, "#errors li") == problem
        await asyncio.to_thread(browser.save_screenshot, str(tmp_path / "web-example.png"))
        if target := os.environ.get("NPCSIM_WEB_SCREENSHOT"):
            shutil.copyfile(tmp_path / "web-example.png", target)
    finally:
        end = await ended(proc, terminate=True)
    assert end.code == 0, end.err


def say(agent: str, to: str, text: str, **reply: str) -> bytes:
    """An NPC's line on its say topic, with `reply_to` and `in_reply_to` when given."""
    return json.dumps({"run": "r", "agent": agent, "tick": 3, "to": to, "text": text, "inference_id": "r:x:3:0",
                       **reply}).encode()


def intent(agent: str, name: str, inference_id: str, args: dict[str, object]) -> bytes:
    """An NPC's intent on its intent topic, carried by the answer whose `inference_id` it has."""
    return json.dumps({"run": "r", "agent": agent, "tick": 3, "name": name, "args": args,
                       "inference_id": inference_id}).encode()


def error(code: str, message: str, **id_: str) -> bytes:
    return json.dumps({"code": code, "message": message, "topic": f"{R}/player/tester/input", **id_}).encode()


async def publish_rosters(run: aiomqtt.Client) -> None:
    """Shard 0's roster (a name with markup in it), and two rosters no page may take."""
    npcs = [["innkeeper", "Mara <b>the</b> innkeeper", "inn"], ["smith", "Bron", "forge"]]
    await run.publish(f"{R}/roster/0", json.dumps({"run": "r", "shard": "0", "npcs": npcs}), qos=1, retain=True)
    await run.publish(f"{R}/roster/1", b"<not json>", qos=1, retain=True)
    await run.publish(f"{R}/roster/2", json.dumps({"npcs": [["not an id!", "x", "y"]]}), qos=1, retain=True)


async def next_input(run: aiomqtt.Client, npc: str, text: str) -> str:
    """The next player input the run gets: to `npc`, saying `text`, with an id; that id."""
    async with asyncio.timeout(30):
        message = await anext(aiter(run.messages))
    assert message.topic.value == f"{R}/player/tester/input"
    body = json.loads(bytes(message.payload))  # type: ignore[arg-type]
    assert {k: body[k] for k in ("to", "text")} == {"to": npc, "text": text}
    assert set(body) == {"to", "text", "id"} and QUESTION_ID.fullmatch(body["id"]), body
    return str(body["id"])


async def test_the_page_matches_by_reply_to_shows_errors_and_keeps_payloads_as_text(
    browser: Any, page: Path, mosquitto: MosquittoProcess
) -> None:
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as run:
        await run.subscribe(f"{R}/player/+/input", qos=1)
        await publish_rosters(run)
        await asyncio.to_thread(browser.get, page_url(page, mosquitto.ws_url, "r", "tester"))
        await on_page("the two NPCs", lambda: [e.get_attribute("data-npc") for e in css(browser, "#npcs li")]
                      == ["innkeeper", "smith"])
        assert texts(browser, "#npcs li")[0] == "Mara <b>the</b> innkeeper innkeeper · inn"
        await on_page("the two rosters ignored", lambda: "ignored 2 " in browser.find_element("id", "ignored").text)

        await ask_on_page(browser, "innkeeper", "A room?")
        first = await next_input(run, "innkeeper", "A room?")
        hostile = "<img src=x onerror=alert(1)>Yes."
        await run.publish(f"{R}/agent/innkeeper/say", say("innkeeper", "other", "Not yours.", reply_to=first,
                                                          in_reply_to="other"), qos=1)
        await run.publish(f"{R}/agent/innkeeper/say", say("innkeeper", "tester", hostile, reply_to=first,
                                                          in_reply_to="tester"), qos=1)
        await on_page("the answer", lambda: css(browser, f'#questions li.answered[data-id="{first}"]'))
        assert texts(browser, f'#questions li[data-id="{first}"] .answer') == [f"innkeeper: {hostile}"]
        assert css(browser, "#questions img, #npcs b") == []

        await ask_on_page(browser, "smith", "A sword?")
        second = await next_input(run, "smith", "A sword?")
        await run.publish(f"{R}/player/tester/error", error("rate_limited", "4 inputs this tick (bound 3)",
                                                            id=second), qos=1)
        await run.publish(f"{R}/player/tester/error", error("not_json", "the payload is not JSON"), qos=1)
        await on_page("both errors", lambda: len(css(browser, "#errors li")) == 2)
        refused = f"rate_limited: 4 inputs this tick (bound 3) (question {second})"
        assert texts(browser, "#errors li") == [refused, "not_json: the payload is not JSON"]
        assert texts(browser, f'#questions li.failed[data-id="{second}"] .problem') == [refused]
        for n in range(150):  # a flood: the page keeps the newest 100
            await run.publish(f"{R}/player/tester/error", error("schema", f"flood {n}"), qos=1)
        last = ["schema: flood 149"]
        await on_page("the flood's last error", lambda: texts(browser, "#errors li:last-child") == last)
        assert len(css(browser, "#errors li")) == 100

        # A line without reply_to answers the oldest open question to that NPC from this player.
        await ask_on_page(browser, "smith", "Still there?")
        third = await next_input(run, "smith", "Still there?")
        await run.publish(f"{R}/agent/smith/say", say("smith", "tester", "Aye."), qos=1)
        answer = f'#questions li[data-id="{third}"] .answer'
        assert await on_page("the answer by NPC and player", lambda: texts(browser, answer)) == ["smith: Aye."]
        assert len({first, second, third}) == 3


async def test_the_page_works_on_the_embedded_broker(
    browser: Any, page: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Mosquitto, `--broker auto` is amqtt (MQTT 3.1.1): the page speaks that too."""
    monkeypatch.setattr(broker_module, "find_mosquitto", lambda: None)
    async with open_broker("auto") as info, aiomqtt.Client(
        "127.0.0.1", info.address.port, protocol=aiomqtt.ProtocolVersion.V311
    ) as run:
        assert info.kind == "embedded" and info.ws_url is not None
        await run.subscribe(f"{R}/player/+/input", qos=1)
        await publish_rosters(run)
        await asyncio.to_thread(browser.get, page_url(page, info.ws_url, "r", "tester"))
        await on_page("the two NPCs", lambda: len(css(browser, "#npcs li")) == 2)
        await ask_on_page(browser, "smith", "A sword?")
        asked = await next_input(run, "smith", "A sword?")
        await run.publish(f"{R}/agent/smith/say", say("smith", "tester", "Tomorrow.", reply_to=asked,
                                                      in_reply_to="tester"), qos=1)
        answer = f'#questions li[data-id="{asked}"] .answer'
        assert await on_page("the answer", lambda: texts(browser, answer)) == ["smith: Tomorrow."]


async def game(*args: str, within: float = 90) -> Ran:
    proc = await asyncio.create_subprocess_exec(sys.executable, str(GAME), *args, cwd=REPO,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    return await ended(proc, within=within)


async def test_the_python_game_asks_every_npc_of_a_live_run_and_prints_the_answers(
    mosquitto: MosquittoProcess,
) -> None:
    proc = await start_npcsim("run", VILLAGE, "--broker", mosquitto.url, "--ticks", "100000", "--tick-ms", "100",
                              "--quiet", stdout=asyncio.subprocess.DEVNULL)
    replies: dict[str, str] = {}  # reply_to -> the NPC, of the lines said to the tester
    try:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as watcher, asyncio.TaskGroup() as group:
            await watcher.subscribe("npcsim/village-7/agent/+/say", qos=1)

            async def watch() -> None:
                async for message in watcher.messages:
                    say = json.loads(bytes(message.payload))  # type: ignore[arg-type]
                    if say.get("in_reply_to") == "tester":
                        replies[say["reply_to"]] = say["agent"]

            watching = group.create_task(watch())
            played = await game("--broker", mosquitto.url, "--run", "village-7", "--player", "tester", "--wait", "20")
            refused = await game("--broker", mosquitto.url, "--run", "village-7", "--player", "tester",
                                 "--npc", "innkeeper", "--text", "x" * 600, "--wait", "20")
            given = await game("--broker", mosquitto.url, "--run", "village-7", "--player", "tester",
                               "--npc", "innkeeper", "--text", "Can I have a lantern?", "--wait", "20")
            watching.cancel()
    finally:
        end = await ended(proc, terminate=True)
    assert end.code == 0, end.err
    assert played.code == 0, (played.out, played.err)
    lines = played.out.splitlines()
    assert lines[0] == "roster: 4 NPCs: blacksmith, guard_captain, innkeeper, snack_machine"
    answered = [re.fullmatch(r"answer (\w+-q\d) <- (\w+): .+", line) for line in lines if line.startswith("answer ")]
    pairs = [(m.group(1), m.group(2)) for m in answered if m]
    assert [npc for _, npc in pairs] == ["blacksmith", "guard_captain", "innkeeper", "snack_machine"]
    assert {id_: replies.get(id_) for id_, _ in pairs} == dict(pairs)  # each answer is the run's reply to that id
    assert lines[-1] == "4 of 4 answered, 0 refused"

    assert refused.code == 1, (refused.out, refused.err)
    asked, error, summary = refused.out.splitlines()[1:]
    asked_id = asked.split()[1]
    assert re.fullmatch(rf"error {re.escape(asked_id)}: too_long: .+", error), refused.out
    assert summary == "0 of 1 answered, 1 refused"

    assert given.code == 0, (given.out, given.err)
    asked, answer, intent, summary = given.out.splitlines()[1:]
    asked_id = asked.split()[1]
    assert answer.startswith(f"answer {asked_id} <- innkeeper: ")
    assert intent == f'intent {asked_id} <- innkeeper: give_item {{"item": "lantern"}}'  # the game acts on it
    assert summary == "1 of 1 answered, 0 refused"


async def test_the_python_game_matches_by_reply_to_prints_errors_and_counts_malformed_messages(
    mosquitto: MosquittoProcess,
) -> None:
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as run:
        await run.subscribe(f"{R}/player/+/input", qos=1)
        await publish_rosters(run)
        async with asyncio.TaskGroup() as group:
            played = group.create_task(game("--broker", mosquitto.url, "--run", "r", "--player", "tester",
                                            "--text", "Hello?", "--wait", "30"))
            first = await next_input(run, "innkeeper", "Hello?")
            await run.publish(f"{R}/agent/innkeeper/say", b"\xff not json", qos=1)
            await run.publish(f"{R}/agent/innkeeper/say", say("innkeeper", "other", "Not yours.", reply_to=first,
                                                              in_reply_to="other"), qos=1)
            await run.publish(f"{R}/agent/innkeeper/say", say("innkeeper", "tester", "Welcome.\x1b[2J\u202e",
                                                              reply_to=first, in_reply_to="tester"), qos=1)
            for agent, inference_id, args in (("innkeeper", "r:x:9:9", {"item": "not yours"}),
                                              ("smith", "r:x:3:0", {"item": "not its"}),
                                              ("innkeeper", "r:x:3:0", {"item": "lantern\x1b[2J"})):
                await run.publish(f"{R}/agent/{agent}/intent", intent(agent, "give_item", inference_id, args), qos=1)
            await run.publish(f"{R}/agent/innkeeper/intent", b'{"agent": "innkeeper"}', qos=1)
            second = await next_input(run, "smith", "Hello?")
            await run.publish(f"{R}/player/tester/error", error("unknown_npc", "no NPC smith here", id=second),
                              qos=1)
    ran = played.result()
    assert ran.code == 1, (ran.out, ran.err)  # a question was refused
    assert ran.out.splitlines() == [
        "roster: 2 NPCs: innkeeper, smith",
        f"asked {first} -> innkeeper: Hello?",
        f"answer {first} <- innkeeper: Welcome.\\u001b[2J\\u202e",  # escapes: nothing drives the terminal
        f"asked {second} -> smith: Hello?",
        f'intent {first} <- innkeeper: give_item {{"item": "lantern\\u001b[2J"}}',  # the answer's, by inference_id
        f"error {second}: unknown_npc: no NPC smith here",
        "1 of 2 answered, 1 refused",
    ]
    assert "ignored a message on npcsim/r/roster/1: not JSON" in ran.err
    assert "ignored 4 malformed message(s)" in ran.err  # two rosters, a line and an intent


@pytest.mark.parametrize(("args", "complaint"), [
    (("--broker", "http://127.0.0.1:1883"), "expected mqtt://host:port or mqtts://host:port, got 'http://"),
    (("--broker", "mqtt://127.0.0.1:99999"), "is not a port number"),
    (("--run", "a run"), "--run: expected 1-128 of A-Z a-z 0-9 _ . -, got 'a run'"),
    (("--wait", "0"), "--wait: expected seconds between 0 and 3600, got '0'"),
    (("--text", "  "), "--text: the question is empty"),
])
async def test_the_python_game_refuses_bad_values_in_one_line(args: tuple[str, ...], complaint: str) -> None:
    given = dict(zip(args[::2], args[1::2], strict=True))
    base = {"--broker": "mqtt://127.0.0.1:1", "--run": "r", "--player": "p"} | given
    ran = await game(*(part for item in base.items() for part in item), within=30)
    assert ran.code == 2 and ran.out == ""
    assert complaint in ran.err.splitlines()[-1], ran.err


async def test_the_python_game_says_in_one_line_that_the_broker_is_not_there() -> None:
    ran = await game("--broker", "mqtt://127.0.0.1:1", "--run", "r", "--player", "p", within=30)
    assert ran.code == 1 and ran.out == ""
    assert ran.err.splitlines() == ["127.0.0.1:1: [Errno 111] Connection refused"]


async def test_the_python_game_reports_a_publish_the_broker_refuses_and_a_game_login_adds_a_fact(
    tmp_path: Path,
) -> None:
    """MQTT 5 on the shipped ACL: alice may not publish the game system's `game/fact` (the PUBACK says
    "Not authorized", which the example reports instead of carrying on); the `game` login may."""
    from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, run
    from sim.store import open_reader
    from sim.wire.inputs import GameFact
    from tests.helpers import eventually
    from tests.secured import secured_broker

    db = tmp_path / "facts.db"
    with secured_broker() as broker:
        stats = RunStats()
        config = RunConfig(scenario=VILLAGE, run_id="ex", until_tick=60, tick_ms=100,
                           broker=BrokerConfig(url=broker.url_for("shard")), record=RecordConfig(db=str(db)))
        async with asyncio.TaskGroup() as group:
            job = group.create_task(run(config, stats=stats))
            await eventually(lambda: stats.tick >= 3, what="the run under way", within=60)
            common = ("--run", "ex", "--npc", "innkeeper", "--wait", "20", "--fact", "bard=A bard sings tonight.")
            refused = await game("--broker", broker.url_for("alice"), "--player", "alice", *common)
            added = await game("--broker", broker.url_for("game"), "--player", "alice", *common)
            await job
    assert refused.code == 1 and refused.out == "", refused
    assert refused.err.strip() == ("refused: game/fact bard: Not authorized (the game system's topics need its "
                                   "login: mqtt://game@host:port)")
    assert added.out.splitlines()[0] == "fact bard -> innkeeper: A bard sings tonight.", added
    assert "refused: player/alice/input: Not authorized" in added.err  # the game login does not speak as alice
    with open_reader(db) as reader:
        facts = [t for _, t in reader.all_inputs() if isinstance(t, GameFact)]
    assert [(f.npc, f.id, f.text) for f in facts] == [("innkeeper", "bard", "A bard sings tonight.")]
