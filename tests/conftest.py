"""Fixtures and the hypothesis profiles; what tests share otherwise is in tests/helpers.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from sim.cli.run import RUNS_ENV
from tests.browser import chromium
from tests.helpers import IN_CI, MosquittoProcess, require_mosquitto
from tests.llama_server import LlamaServer, require_llama_server

settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile(
    "ci", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("ci" if IN_CI else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True)
def runs_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder where a run without --db keeps its store (sim.cli.run.RUNS_ENV), the test's
    own: `npcsim run` in a test, in this process or a child, never writes the clone's ./runs."""
    folder = tmp_path_factory.mktemp("runs")
    monkeypatch.setenv(RUNS_ENV, str(folder))
    return folder


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


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama.cpp's server with the bundled model, shared by a module's tests; stopped however they end."""
    binary, model = require_llama_server()
    server = LlamaServer(binary, model, tmp_path_factory.mktemp("llama-server") / "server.log")
    try:
        yield server
    finally:
        server.stop()
