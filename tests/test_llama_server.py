"""The village against llama.cpp's own server and the bundled small model: every prompt token
accounted for, and a token budget over the server's window refused.

For every attempt of every record, `npcsim audit export` says how many prompt tokens the
server evaluated and how many it reused from its cache; together they are the prompt's
token count as the server's `/tokenize` gives it for the exact text the server was sent.
That text is, on the completions endpoint, the attempt's recorded prompt; on the chat
endpoint, the record's rebuilt messages through the model's chat template (`/apply-template`:
the attempt's prompt holds the messages' contents only). Both are tokenized as the server
tokenizes a prompt, special tokens (a BOS, where the model adds one) included, so the counts
compare exactly.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sim.errors import ConfigError
from sim.inference import check_context_window
from sim.store import open_reader
from tests.helpers import MosquittoProcess, run_npcsim
from tests.llama_server import LlamaServer, exported, run_village

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow, pytest.mark.timeout(900)]


def sent_text(server: LlamaServer, db: Path, row: dict[str, Any], attempt: dict[str, Any]) -> str:
    """What the server was sent on `attempt`: the prompt, or the messages in the chat template."""
    if attempt["form"] == "text":
        return str(attempt["prompt"])
    with open_reader(db) as reader:
        record = reader.audit_record(row["id"])
    return server.chat_prompt(record.memory(attempt["prohibition"]).messages())


def check_every_prompt_token(server: LlamaServer, db: Path) -> tuple[int, int, int]:
    """(records, prompt tokens evaluated, prompt tokens reused), every attempt's checked."""
    rows = exported(db)
    assert rows
    evaluated = cached = 0
    for row in rows:
        assert row["attempts"], row["id"]
        for attempt in row["attempts"]:
            usage, served_by = attempt["usage"], attempt["served_by"]
            assert usage is not None, f"{row['id']}: no reply ({attempt['problem']})"
            assert usage["prompt_tokens"] == server.token_count(sent_text(server, db, row, attempt)), row["id"]
            assert 0 <= usage["cached_tokens"] <= usage["prompt_tokens"]
            assert usage["completion_tokens"] is not None and usage["prompt_ms"] is not None
            assert served_by["model"] and served_by["build"]
            evaluated += usage["prompt_tokens"] - usage["cached_tokens"]
            cached += usage["cached_tokens"]
    return len(rows), evaluated, cached


@pytest.mark.parametrize(("endpoint", "ticks"), [("completions", 30), ("chat", 20)])
async def test_every_prompt_token_is_evaluated_or_reused(
    llama_server: LlamaServer, mosquitto: MosquittoProcess, tmp_path: Path, endpoint: str, ticks: int
) -> None:
    db = tmp_path / f"{endpoint}.db"
    await run_village(llama_server, mosquitto.url, db, endpoint, ticks)
    records, evaluated, cached = await asyncio.to_thread(check_every_prompt_token, llama_server, db)
    print(f"{endpoint}, {ticks} ticks: {records} records, {evaluated} prompt tokens evaluated, {cached} reused")
    assert cached > 0  # the NPCs' prompts share their start: the server's cache reuses it
    build = llama_server.get("/props")["build_info"]
    assert {a["served_by"]["build"] for r in exported(db) for a in r["attempts"]} == {build}
    replay = await asyncio.to_thread(run_npcsim, "audit", "replay", "--db", str(db), "--jobs", "1",
                                     "--backend", "openai", "--base-url", llama_server.base_url)
    assert replay.code == 0, replay.err
    assert "every record that names its model was answered by the one openai serves now" in replay.out


async def test_a_token_budget_over_the_servers_window_is_refused(llama_server: LlamaServer) -> None:
    window = llama_server.get("/props")["default_generation_settings"]["n_ctx"]
    options = {"base_url": llama_server.base_url, "max_tokens": 64}
    await check_context_window("openai", options, window - 64)
    with pytest.raises(ConfigError, match=f"cannot fit the server's context window of {window} tokens per slot"):
        await check_context_window("openai", options, window - 63)
