"""The web view in a real headless Chromium (Debian's chromium + chromium-driver, driven by selenium).

A run and its view start; the page shows the NPCs and the dialogue, a person speaks to
an NPC from the page and sees the answer, and the budget bars of the chosen NPC match
its latest audit record in the shard's store. `NPCSIM_SCREENSHOT=docs/view.png` also
saves the README's screenshot.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    view = LiveView()
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
            await asyncio.to_thread(lambda: browser.find_element("id", "speak-player").clear())
            await asyncio.to_thread(lambda: browser.find_element("id", "speak-player").send_keys("tester"))
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
