"""The web view in a real headless Chromium (Debian's chromium + chromium-driver, driven by selenium).

A run and its view start; the page shows the NPCs and the dialogue, a person speaks to
an NPC from the page and sees the answer, and the budget bars of the chosen NPC match
its latest audit record in the shard's store. `NPCSIM_SCREENSHOT=docs/view.png` also
saves the README's screenshot.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from sim.mqtt import BrokerAddress
from sim.runner import RunConfig, run
from sim.store import open_reader
from sim.view import LiveView, StoredRun, ViewSource, build_app, open_view_server
from tests.helpers import IN_CI, VILLAGE, MosquittoProcess, eventually

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1500,950")
WAIT_S = 60.0


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (os.access(CHROMIUM, os.X_OK) and shutil.which(CHROMEDRIVER)):
        if IN_CI:
            pytest.fail("chromium and chromium-driver are not installed, and CI=true: .ci/run installs them")
        pytest.skip("chromium or chromium-driver is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        driver.set_page_load_timeout(WAIT_S)
        yield driver
    finally:
        driver.quit()


async def on_page(what: str, probe: Callable[[], Any]) -> Any:
    """`eventually` for the page: `probe` runs in a thread (selenium blocks)."""
    return await eventually(lambda: asyncio.to_thread(probe), what=what, within=WAIT_S, every=0.2)


def css(driver: Any, selector: str) -> list[Any]:
    return list(driver.find_elements("css selector", selector))


async def test_page_shows_the_run_speaks_and_matches_the_audit(
    browser: Any, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    db = tmp_path / "run.db"
    config = RunConfig(scenario=VILLAGE, broker=mosquitto.url, run_id="web",
                       ticks=100_000, tick_ms=150, db=str(db))
    view = LiveView(player="tester")  # the operator's choice (--as-player): the page cannot change it
    stop, ready = asyncio.Event(), asyncio.Event()
    async with open_view_server(build_app(view.source()), "127.0.0.1", 0) as url, asyncio.TaskGroup() as group:
        job = group.create_task(run(config, stop=stop, on_ready=lambda _s: ready.set()))
        await ready.wait()
        feed = group.create_task(view.follow(BrokerAddress.parse(mosquitto.url), "web"))
        try:
            await asyncio.to_thread(browser.get, url)
            await on_page("the NPCs", lambda: len(css(browser, ".npc-chip")) == 4)
            await on_page("a line of dialogue", lambda: css(browser, "#dialogue li.npc"))
            assert "innkeeper" in {c.get_attribute("data-npc") for c in css(browser, ".npc-chip")}

            await asyncio.to_thread(lambda: css(browser, '.npc-chip[data-npc="innkeeper"]')[0].click())
            assert await asyncio.to_thread(lambda: browser.find_element("id", "speak-player").text) == "tester"
            await asyncio.to_thread(lambda: browser.find_element("id", "speak-text").send_keys("A room, please."))
            await asyncio.to_thread(lambda: browser.find_element("id", "speak-send").click())
            await on_page("the player's line", lambda: css(browser, '#dialogue li.player[data-speaker="tester"]'))
            answer = await on_page(
                "the innkeeper's answer",
                lambda: [li.text for li in css(browser, '#dialogue li[data-speaker="innkeeper"]')
                         if "→ tester" in li.text],
            )
            assert answer
        finally:
            stop.set()
        await job
        last_tick = latest_tick(db, "innkeeper")
        await on_page("the view to have the last trace", lambda: newest_trace(view)["tick"] == last_tick)
        shown = newest_trace(view)["inference_id"]
        await asyncio.to_thread(lambda: css(browser, '.npc-chip[data-npc="innkeeper"]')[0].click())
        await on_page("the latest snapshot on the page",
                         lambda: browser.find_element("id", "npc-detail").get_attribute("data-inference") == shown)
        with open_reader(db) as reader:
            record = reader.audit_record(shown)
        table = await asyncio.to_thread(read_budget_table, browser)
        report = record.report
        assert table["mandatory"]["used"] == str(report.mandatory_chars)
        for name in ("dialogue", "episodic", "beliefs", "canonical_facts", "world_state"):
            category = getattr(report, name)
            assert table[name] == {"budget": str(category.budget), "used": str(category.used),
                                   "kept": str(category.kept), "dropped": str(category.dropped)}, name
        bar = await asyncio.to_thread(
            lambda: {s.get_attribute("data-cat"): int(s.get_attribute("data-chars"))
                     for s in css(browser, "#bars .snapshot:first-child .seg")})
        assert bar == {"mandatory": report.mandatory_chars, "dialogue": report.dialogue.used,
                       "episodic": report.episodic.used, "beliefs": report.beliefs.used}
        prompt = await asyncio.to_thread(lambda: browser.find_element("id", "prompt").text)
        assert record.prompt is not None and prompt.split("\n")[0] == record.prompt.split("\n")[0]
        await asyncio.to_thread(browser.save_screenshot, str(tmp_path / "view.png"))
        if target := os.environ.get("NPCSIM_SCREENSHOT"):
            shutil.copyfile(tmp_path / "view.png", target)
        feed.cancel()


def latest_tick(db: Path, agent: str) -> int:
    with open_reader(db) as reader:
        return max(summary.tick for summary in reader.audit_summaries(agent))


def newest_trace(view: LiveView) -> dict[str, Any]:
    npc = view.model.npc_view("innkeeper")
    return npc["traces"][0] if npc and npc["traces"] else {"tick": -1, "inference_id": ""}


def read_budget_table(driver: Any) -> dict[str, dict[str, str]]:
    table: dict[str, dict[str, str]] = {}
    for row in css(driver, "#budget tbody tr"):
        cells = {td.get_attribute("data-field"): td.text for td in row.find_elements("css selector", "td[data-field]")}
        table[row.get_attribute("data-cat")] = cells
    return table


async def test_stored_run_page_moves_with_the_tick_slider(
    browser: Any, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    db = tmp_path / "done.db"
    await run(RunConfig(scenario=VILLAGE, broker=mosquitto.url, run_id="old",
                        ticks=12, db=str(db)))
    stored = StoredRun(db)
    with open_reader(db) as reader:  # a tick at which someone spoke, after the first one
        target = sorted({r.tick for r in reader.audit_records()})[1]
    source = ViewSource(model=stored.model, live=False, ticks=(stored.first_tick, stored.last_tick))
    async with open_view_server(build_app(source), "127.0.0.1", 0) as url:
        await asyncio.to_thread(browser.get, url)
        await on_page("the stored run", lambda: css(browser, "#dialogue li"))
        assert await asyncio.to_thread(lambda: browser.find_element("id", "speak").is_displayed()) is False
        last = await asyncio.to_thread(lambda: browser.find_element("id", "health-tick").text)
        assert last == str(stored.last_tick)
        await asyncio.to_thread(browser.execute_script, """
            const slider = document.getElementById('tick-slider');
            slider.value = arguments[0]; slider.dispatchEvent(new Event('change'));""", target)
        await on_page(f"tick {target}", lambda: browser.find_element("id", "health-tick").text == str(target))
        ticks = await asyncio.to_thread(lambda: [li.find_element("css selector", ".tick").text
                                                 for li in css(browser, "#dialogue li")])
        assert ticks and all(int(t[1:]) <= target for t in ticks)


# A page on another origin (another port of 127.0.0.1) that tries every way a browser lets
# it speak through the view: two forms (text/plain shaped like JSON, and url-encoded) into
# iframes, two no-cors fetches (text/plain, and "application/json", which no-cors drops),
# and a cors fetch with a forged token (its preflight is never granted).
ATTACK = """<!doctype html><html><head><title>attacking</title></head><body>
<form id="plain" action="{say}" method="POST" enctype="text/plain" target="sink1">
<input name='{{"to": "innkeeper", "text": "CSRF-FORM-PLAIN", "x": "' value='"}}'></form>
<form id="encoded" action="{say}" method="POST" target="sink2">
<input name="to" value="innkeeper"><input name="text" value="CSRF-FORM-ENCODED"></form>
<iframe name="sink1"></iframe><iframe name="sink2"></iframe>
<script>
const body = (text) => JSON.stringify({{to: "innkeeper", text: text}});
document.getElementById("plain").submit();
document.getElementById("encoded").submit();
Promise.allSettled([
  fetch("{say}", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
                   body: body("CSRF-NOCORS-PLAIN")}}),
  fetch("{say}", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "application/json"}},
                   body: body("CSRF-NOCORS-JSON")}}),
  fetch("{say}", {{method: "POST", mode: "cors", headers: {{"Content-Type": "application/json",
                   "X-Npcsim-Token": "forged.0123"}}, body: body("CSRF-CORS")}}),
]).then((results) => {{ document.title = "done " + results.map((r) => r.status).join(","); }});
</script></body></html>"""


async def test_a_page_on_another_origin_cannot_speak_through_the_view(
    browser: Any, mosquitto: MosquittoProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """Cross-origin forms and no-cors fetches in headless Chromium: refused, nothing published."""
    from aiohttp import web

    view = LiveView("csrf")
    heard: list[str] = []
    subscribed = asyncio.Event()

    async def listen() -> None:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.subscribe("npcsim/csrf/player/+/input", qos=1)
            subscribed.set()
            async for message in client.messages:
                heard.append(bytes(message.payload).decode() if isinstance(message.payload, bytes) else "")

    async def attacker(url: str) -> Any:
        app = web.Application()

        async def page(_: web.Request) -> web.Response:
            return web.Response(text=ATTACK.format(say=url + "api/say"), content_type="text/html")

        app.router.add_get("/", page)
        return app

    with caplog.at_level(logging.INFO, logger="sim.view.access"):
        async with open_view_server(build_app(view.source()), "127.0.0.1", 0) as url, asyncio.TaskGroup() as group:
            feed = group.create_task(view.follow(BrokerAddress.parse(mosquitto.url), "csrf"))
            listener = group.create_task(listen())
            await subscribed.wait()
            other = web.AppRunner(await attacker(url))
            await other.setup()
            try:
                site = web.TCPSite(other, "127.0.0.1", 0)
                await site.start()
                attack_url = f"http://127.0.0.1:{other.addresses[0][1]}/"
                assert attack_url != url
                await asyncio.to_thread(browser.get, attack_url)
                # every fetch fails in the page: the no-cors answers by Cross-Origin-Resource-Policy, the cors
                # one at its preflight; the four POSTs that reached the view were refused there
                title = await on_page("the attack to finish", lambda: browser.title.startswith("done") and
                                         browser.title)
                assert title == "done rejected,rejected,rejected"
                await eventually(lambda: len(_refused_posts(caplog)) >= 4, what="the four POSTs refused", within=WAIT_S)
            finally:
                await other.cleanup()
            # the control: the view's own page speaks, and its line is the first the broker carries
            await asyncio.to_thread(browser.get, url)
            await on_page("the page", lambda: browser.find_element("id", "speak-player").text == "viewer")
            await asyncio.to_thread(lambda: browser.find_element("id", "speak-to").send_keys("innkeeper"))
            await asyncio.to_thread(lambda: browser.find_element("id", "speak-text").send_keys("CONTROL"))
            await asyncio.to_thread(lambda: browser.find_element("id", "speak-send").click())
            await eventually(lambda: any("CONTROL" in h for h in heard), what="the control line", within=WAIT_S)
            feed.cancel()
            listener.cancel()
    assert [h for h in heard if "CSRF" in h] == [] and len(heard) == 1, heard
    reasons = " ".join(_refused_posts(caplog))
    assert "application/json" in reasons  # the forms and no-cors fetches: not JSON


def _refused_posts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("view: refused POST")]
