"""A real headless Chromium for the tests of web pages (Debian's chromium + chromium-driver,
driven by selenium): the `browser` fixture (tests/conftest.py) and how tests wait on a page."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import IN_CI, eventually

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1500,950")
WAIT_S = 60.0


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[Any]:
    """A headless Chromium with its own profile directory; skipped (failed in CI) when absent."""
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (os.access(CHROMIUM, os.X_OK) and shutil.which(CHROMEDRIVER)):
        if IN_CI:
            pytest.fail("chromium and chromium-driver are not installed, and CI=true: .ci/run installs them")
        pytest.skip("chromium or chromium-driver is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        driver.set_page_load_timeout(WAIT_S)
        yield driver
    finally:
        driver.quit()


async def on_page(what: str, probe: Callable[[], Any]) -> Any:
    """`eventually` for the page: `probe` runs in a thread (selenium blocks).

    A live page redraws its lists whenever the stream brings something: elements a probe
    found may go stale before it reads them, and the probe is simply tried again.
    """
    from selenium.common.exceptions import StaleElementReferenceException

    def fresh_probe() -> Any:
        try:
            return probe()
        except StaleElementReferenceException:
            return None

    return await eventually(lambda: asyncio.to_thread(fresh_probe), what=what, within=WAIT_S, every=0.2)


async def click(driver: Any, what: str, selector: str) -> None:
    """Click the first element `selector` finds, again if the page redrew it under the click."""
    await on_page(what, lambda: css(driver, selector)[0].click() or True)


def css(driver: Any, selector: str) -> list[Any]:
    return list(driver.find_elements("css selector", selector))
