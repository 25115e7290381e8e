"""Fixtures and the hypothesis profiles; what tests share otherwise is in tests/helpers.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.browser import chromium
from tests.helpers import IN_CI, MosquittoProcess, require_mosquitto

settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile(
    "ci", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("ci" if IN_CI else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoProcess]:
    """A running private Mosquitto for one test; stopped however the test ends."""
    broker = MosquittoProcess(require_mosquitto(), tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium (tests/browser.py) for one test; it quits however the test ends."""
    with chromium(tmp_path / "chromium-profile") as driver:
        yield driver
