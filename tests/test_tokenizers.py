"""Token budgets in the model's own tokens: "gguf:PATH" (the model file's vocabulary) and
"server" (the llama.cpp server's `/tokenize`, whose counts the I/O layer fetches before a
build and hands in).

The server's tokenizer is tested against a small real HTTP server on loopback (in a
thread), against tests/fake_openai.py in a whole village run whose record is then
replayed with the server stopped, and against llama.cpp's own server with the bundled
model, which must count exactly what the server's `/tokenize` gives for the prompt.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import sim.memory
from sim.errors import ConfigError
from sim.inference import counted_memory, open_tokenizer
from sim.inference.backends.llamacpp import bundled_model_path, missing_requirement
from sim.inference.backends.tokenize import open_server_tokenizer
from sim.memory import CountsMissing, WorkingMemoryConfig, build_working_memory, token_counter
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, run
from sim.store import open_reader
from tests.fake_openai import open_fake_openai
from tests.helpers import REPO, VILLAGE, MosquittoProcess, free_port, npcsim_in_process, run_npcsim
from tests.llama_server import LlamaServer, run_village
from tests.test_memory import big_state

FORMS = '"cl100k", "server", "gguf:PATH"'


class TokenizeHandler(BaseHTTPRequestHandler):
    """`POST /tokenize` with one token per word of the content, or 404 when the server has
    no tokenizer (as a vLLM or OpenAI server answers llama.cpp's request)."""

    server: StubServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.asked.append(body)
        if not self.server.tokenizes or self.path != "/tokenize":
            self._send(404, {"error": "not found"})
            return
        self._send(200, {"tokens": list(range(len(body["content"].split())))})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads `asked`, not a log."""


class StubServer(ThreadingHTTPServer):
    request_queue_size = 64  # a tokenizer asks for several counts at once

    def __init__(self, tokenizes: bool) -> None:
        super().__init__(("127.0.0.1", 0), TokenizeHandler)
        self.tokenizes = tokenizes
        self.asked: list[dict[str, Any]] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


def stub(tokenizes: bool) -> Iterator[StubServer]:
    server = StubServer(tokenizes)
    thread = threading.Thread(target=server.serve_forever, name="tokenize-stub", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def tokenizing() -> Iterator[StubServer]:
    yield from stub(tokenizes=True)


@pytest.fixture
def not_tokenizing() -> Iterator[StubServer]:
    yield from stub(tokenizes=False)


def words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("name", ["gpt9", "gguf:", "Server", "cl100k_base"])
def test_unknown_tokenizer_names_are_refused_listing_the_forms(name: str) -> None:
    with pytest.raises(ConfigError, match=f"^tokenizer: unknown tokenizer '{name}'; known forms: {FORMS}$"):
        WorkingMemoryConfig(tokenizer=name)


def test_a_record_naming_a_models_tokenizer_decodes_without_it() -> None:
    """The config is checked for its form only: the tokenizer is opened with the run."""
    config = WorkingMemoryConfig(tokenizer="gguf:/nowhere/model.gguf", max_context_tokens=100)
    assert WorkingMemoryConfig(tokenizer="server", max_context_tokens=100).tokenizer == "server"
    with pytest.raises(ConfigError, match=r"^tokenizer 'gguf:/nowhere/model\.gguf'"):
        build_working_memory(big_state(), "hi", config)


def test_server_tokens_without_a_server_are_refused_in_one_line() -> None:
    config = WorkingMemoryConfig(tokenizer="server", max_context_tokens=200)
    with pytest.raises(ConfigError, match="none is open in this process") as caught:
        build_working_memory(big_state(), "hi", config)
    assert "\n" not in str(caught.value)
    build_working_memory(big_state(), "hi", WorkingMemoryConfig(tokenizer="server"))  # no token budget: no count


def test_counts_handed_in_cut_the_budget_and_a_text_they_lack_is_named() -> None:
    """A build counts with what it is handed: a counting function, or counts by text; it
    names every text those lack, and another build is not changed by it (nothing is installed)."""
    config = WorkingMemoryConfig(tokenizer="server", max_context_tokens=60)
    counted = build_working_memory(big_state(), "hello there", config, counts=words)
    assert counted.report.prompt_tokens == words(counted.prompt) <= 60
    with pytest.raises(CountsMissing) as caught:
        build_working_memory(big_state(), "hello there", config, counts={})
    lacking = caught.value.texts
    assert lacking and len(set(lacking)) == len(lacking)
    known = {text: words(text) for text in lacking}
    while True:  # what the I/O layer does: fetch what is named, build again
        try:
            again = build_working_memory(big_state(), "hello there", config, counts=known)
        except CountsMissing as more:
            known.update((text, words(text)) for text in more.texts)
            continue
        break
    assert again == counted
    with pytest.raises(ConfigError, match="none is open in this process"):
        build_working_memory(big_state(), "hello there", config)


def test_the_pure_core_reaches_no_network_client() -> None:
    code = ("import sys, sim.memory\n"
            "clients = ('httpx', 'httpcore', 'aiohttp', 'requests', 'urllib3', 'http.client', 'aiomqtt', 'aiosqlite')\n"
            "print(sorted(m for m in clients if m in sys.modules))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert shown.stdout.strip() == "[]"
    assert not hasattr(sim.memory, "counting_with")


async def test_the_server_counts_each_text_once_and_the_budget_holds_in_its_tokens(tokenizing: StubServer) -> None:
    config = WorkingMemoryConfig(tokenizer="server", max_context_tokens=60)
    async with open_server_tokenizer({"base_url": [tokenizing.base_url, "http://127.0.0.1:9/v1"]}) as tokenizer:
        first, used = await counted_memory(big_state(), "hello there", config, tokenizer)  # the first server counts
        asked = len(tokenizing.asked)
        again, used_again = await counted_memory(big_state(), "hello there", config, tokenizer)
    assert first == again and len(tokenizing.asked) == asked  # every text counted already
    assert used == used_again and used[first.prompt] == words(first.prompt)
    assert build_working_memory(big_state(), "hello there", config, counts=used) == first  # all a replay needs
    assert first.report.prompt_tokens == words(first.prompt) <= 60
    assert 0 < len(first.dialogue) < 30
    assert {(b["add_special"], b["parse_special"]) for b in tokenizing.asked} == {(False, False)}


async def test_a_build_waiting_for_its_counts_leaves_the_loop_free() -> None:
    """The shard's loop goes on while the server counts: the build awaits its counts, it
    never blocks on them (the fake server answers on this very loop)."""
    config = WorkingMemoryConfig(tokenizer="server", max_context_tokens=60)
    async with open_fake_openai() as server, open_server_tokenizer({"base_url": server.base_url}) as tokenizer:
        server.held.clear()
        building = asyncio.create_task(counted_memory(big_state(), "hello there", config, tokenizer))
        async with asyncio.timeout(10):
            await server.counting.wait()
        assert not building.done()
        server.held.set()
        memory, used = await building
    assert memory.report.prompt_tokens == words(memory.prompt) == used[memory.prompt] <= 60


async def test_a_run_refuses_server_tokens_it_cannot_count(not_tokenizing: StubServer) -> None:
    config = WorkingMemoryConfig(tokenizer="server", max_context_tokens=200)
    with pytest.raises(ConfigError, match=r"^tokenizer 'server' counts with a llama\.cpp server's /tokenize, "
                                          r"and backend 'scripted' has none"):
        async with open_tokenizer(config, "scripted", {}):
            pass
    with pytest.raises(ConfigError, match=r"^tokenizer 'server': POST http://127.0.0.1:\d+/tokenize answered 404 "
                                          "without a list of tokens: a llama.cpp server counts tokens there, "
                                          "a vLLM or OpenAI server cannot"):
        async with open_tokenizer(config, "openai", {"base_url": not_tokenizing.base_url}):
            pass
    with pytest.raises(ConfigError, match=r"^tokenizer 'server': POST http://127.0.0.1:\d+/tokenize: ConnectError"):
        async with open_tokenizer(config, "openai", {"base_url": f"http://127.0.0.1:{free_port()}/v1"}):
            pass
    async with open_tokenizer(WorkingMemoryConfig(tokenizer="server"), "scripted", {}) as none:
        assert none is None  # without a token budget nothing is counted


async def test_a_run_counts_with_its_first_server_while_open(tokenizing: StubServer) -> None:
    config = WorkingMemoryConfig(tokenizer="server", max_context_tokens=60)
    async with open_tokenizer(config, "openai", {"base_url": tokenizing.base_url}) as tokenizer:
        memory, _ = await counted_memory(big_state(), "hi", config, tokenizer)
    assert memory.report.prompt_tokens == words(memory.prompt)
    with pytest.raises(ConfigError, match="none is open"):
        build_working_memory(big_state(), "hi", config)


def test_a_gguf_tokenizer_needs_the_llm_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    name = f"gguf:{tmp_path}/absent-extra.gguf"
    with pytest.raises(ConfigError, match=rf"^tokenizer '{name}' needs the 'llm' extra: pip install 'npcsim\[llm\]'$"):
        token_counter(name)


def test_memory_show_counts_with_the_tokenizer_given(capsys: pytest.CaptureFixture[str]) -> None:
    tokens = ("--set", "memory.max_context_tokens=300", "--set")
    ran = npcsim_in_process(capsys, "memory", "show", "gate", *tokens, "memory.tokenizer=gpt9")
    assert ran.code != 0
    assert ran.err.strip().splitlines() == [
        "npcsim: error: --set memory.max_context_tokens=300 memory.tokenizer=gpt9: tokenizer: unknown tokenizer "
        f"'gpt9'; known forms: {FORMS}"
    ]
    ran = npcsim_in_process(capsys, "memory", "show", "gate", *tokens, "memory.tokenizer=server")
    assert ran.code != 0 and "none is open in this process" in ran.err and len(ran.err.strip().splitlines()) == 1


def require_gguf() -> Path:
    missing = missing_requirement()
    if missing is not None:
        pytest.skip(missing)
    path = bundled_model_path()
    assert path is not None
    return path


def test_bad_gguf_files_are_refused_naming_the_path(tmp_path: Path) -> None:
    require_gguf()
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(ConfigError, match=f"^tokenizer 'gguf:{text}': not a GGUF file$"):
        token_counter(f"gguf:{text}")
    with pytest.raises(ConfigError, match=f"^tokenizer 'gguf:{tmp_path}/absent.gguf': cannot read the file"):
        token_counter(f"gguf:{tmp_path}/absent.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ConfigError, match=f"^tokenizer 'gguf:{broken}': llama.cpp cannot load its vocabulary$"):
        token_counter(f"gguf:{broken}")


def test_a_gguf_tokenizer_counts_in_the_models_own_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    import llama_cpp

    path = require_gguf()
    config = WorkingMemoryConfig(tokenizer=f"gguf:{path}", max_context_tokens=120)
    memory = build_working_memory(big_state(), "hello", config)
    vocabulary = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tokens = len(vocabulary.tokenize(memory.prompt.encode(), add_bos=False, special=False))
    assert memory.report.prompt_tokens == tokens <= 120
    assert token_counter(f"gguf:{path}") is token_counter(f"gguf:{path}")  # loaded once
    assert token_counter("cl100k")(memory.prompt) != tokens  # another vocabulary
    shown = npcsim_in_process(capsys, "memory", "show", "gate", "--set", "memory.max_context_tokens=200",
                              "--set", f"memory.tokenizer=gguf:{path}", "--json")
    assert shown.code == 0, shown.err
    for line in shown.out.splitlines():
        row = json.loads(line)
        assert row["report"]["prompt_tokens"] == len(vocabulary.tokenize(row["prompt"].encode(), add_bos=False,
                                                                         special=False)) <= 200


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_server_and_gguf_count_what_llama_servers_tokenize_gives(llama_server: LlamaServer) -> None:
    path = require_gguf()
    for name in ("server", f"gguf:{path}"):
        config = WorkingMemoryConfig(tokenizer=name, max_context_tokens=150, max_context_chars=4000)
        async with open_tokenizer(config, "openai", {"base_url": llama_server.base_url}) as tokenizer:
            memory, _ = await counted_memory(big_state(), "Good morrow, smith.", config, tokenizer)
        asked = llama_server.post("/tokenize", {"content": memory.prompt, "add_special": False})
        assert memory.report.prompt_tokens == len(asked["tokens"]) <= 150, name
        assert 0 < len(memory.dialogue) < 30


@pytest.mark.mosquitto
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_village_run_keeps_its_budget_in_the_servers_tokens(
    llama_server: LlamaServer, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    limit = 250  # the village's first prompts hold up to about 320 tokens, their mandatory part about 160
    scenario = tmp_path / "village.toml"
    village = await asyncio.to_thread(Path(VILLAGE).read_text)
    await asyncio.to_thread(scenario.write_text,
                            f'{village}\n[memory]\nmax_context_tokens = {limit}\ntokenizer = "server"\n')
    db = tmp_path / "run.db"
    await run_village(llama_server, mosquitto.url, db, "completions", 8, scenario=str(scenario))
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert records
    for record in records:
        assert record.config.tokenizer == "server" and not record.report.over_budget, record.id
        asked = llama_server.post("/tokenize", {"content": record.attempts[0].prompt, "add_special": False})
        assert record.report.prompt_tokens == len(asked["tokens"]) <= limit, record.id
    assert any(r.report.dialogue.dropped or r.report.episodic.dropped or r.report.beliefs.dropped for r in records)
    replay = await asyncio.to_thread(run_npcsim, "audit", "replay", "--db", str(db), "--jobs", "2",
                                     "--backend", "openai", "--base-url", llama_server.base_url)
    assert replay.code == 0, replay.err
    assert f"replayed {len(records)} records: all byte-identical" in replay.out
    unopened = await asyncio.to_thread(run_npcsim, "audit", "replay", "--db", str(db), "--jobs", "1")
    assert unopened.code == 0, unopened.out  # the counts are in the records
    assert f"replayed {len(records)} records: all byte-identical" in unopened.out


@pytest.mark.mosquitto
async def test_a_village_counted_by_its_server_replays_identical_with_the_server_stopped(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every other reply is empty, so workers build retries, counting them with the server too."""
    limit = 150
    scenario = tmp_path / "village.toml"
    village = await asyncio.to_thread(Path(VILLAGE).read_text)
    await asyncio.to_thread(scenario.write_text,
                            f'{village}\n[memory]\nmax_context_tokens = {limit}\ntokenizer = "server"\n')
    db = tmp_path / "village.db"
    async with open_fake_openai(reply="Four copper, friend.") as server:
        server.script = ["empty", "ok"] * 1000
        config = RunConfig(
            scenario=str(scenario), run_id="counted", ticks=8, broker=BrokerConfig(url=mosquitto.url),
            inference=InferenceConfig(backend="openai", backend_options={"base_url": server.base_url}, concurrency=1),
            record=RecordConfig(db=str(db)),
        )
        stats = await run(config)
        tokenized = len(server.tokenized)
    assert stats.inferences > 0 and tokenized > 0
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert any(len(r.attempts) == 2 for r in records)
    assert any(r.report.dialogue.dropped or r.report.episodic.dropped or r.report.beliefs.dropped for r in records)
    for record in records:
        assert record.config.tokenizer == "server" and record.counts, record.id
        for attempt in record.attempts:
            memory = record.memory(attempt.prohibition)
            assert memory.report.prompt_tokens == words(memory.prompt) <= limit, record.id
    capsys.readouterr()
    replayed = npcsim_in_process(capsys, "audit", "replay", "--db", str(db), "--jobs", "1")
    assert replayed.code == 0, replayed.err
    assert f"replayed {len(records)} records: all byte-identical" in replayed.out
    executed = await asyncio.to_thread(npcsim_in_process, capsys, "replay", "--db", str(db))
    assert executed.code == 0, executed.err
    assert executed.out.startswith(f"identical: {len(records)} records"), executed.out
