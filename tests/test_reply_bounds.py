"""Replies that end: the structured reply's schema bounds every string and list, the bounds
reach each endpoint's request (chat `response_format`, completions `json_schema`, the
in-process grammar), a reply at the schema's longest fits the `max_tokens` asked and parses,
a `structured_max_tokens` that cannot hold it is refused before a run starts, and the
penalties against loops are sent and recorded (docs/npc-output.md, "Replies that end")."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest

from sim.errors import ConfigError
from sim.inference import PoolConfig, check_reply_room, open_pool
from sim.inference.backends import llamacpp
from sim.output import (
    MAX_ARG_CHARS,
    MAX_LINE_CHARS,
    MAX_PROPOSAL_CHARS,
    OutputPolicy,
    Rules,
    judge_reply,
    longest_reply,
    read_reply,
    reply_schema,
    reply_tokens,
)
from sim.output.gates import arg_schema
from sim.scenario import load_scenario
from sim.wire.events import MAX_NAME_CHARS
from tests.fake_openai import FakeOpenAI, open_fake_openai
from tests.helpers import VILLAGE, run_npcsim
from tests.inference_helpers import make_request

INNKEEPER = load_scenario(VILLAGE).npc("innkeeper").policy()
assert INNKEEPER is not None
SCHEMA = reply_schema(INNKEEPER, MAX_LINE_CHARS)
LONGEST = longest_reply(SCHEMA)


def walk(schema: Any) -> Iterator[dict[str, Any]]:
    """Every sub-schema of `schema`, itself first."""
    if isinstance(schema, dict):
        yield schema
        for value in schema.values():
            yield from walk(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from walk(value)


def test_every_string_and_list_of_the_schema_is_bounded_by_the_gates() -> None:
    strings = [s for s in walk(SCHEMA) if s.get("type") == "string" and "enum" not in s]
    assert strings and all(0 < s["maxLength"] <= MAX_PROPOSAL_CHARS for s in strings)
    assert all("maxItems" in s for s in walk(SCHEMA) if s.get("type") == "array")
    assert all("enum" in s for s in walk(SCHEMA) if s.get("type") == "number")  # a weight: tenths
    said = SCHEMA["properties"]
    assert said["say"]["maxLength"] == MAX_LINE_CHARS
    assert reply_schema(INNKEEPER, 80)["properties"]["say"]["maxLength"] == 80  # the run's line limit
    assert said["beliefs"]["maxItems"] == INNKEEPER.max_beliefs
    assert said["remember"]["maxItems"] == INNKEEPER.max_memories
    belief = said["beliefs"]["items"]["properties"]
    assert belief["about"]["maxLength"] == MAX_NAME_CHARS and belief["text"]["maxLength"] == MAX_PROPOSAL_CHARS
    assert list(said) == ["say", "beliefs", "remember", "intent"]  # the line first
    intents = said["intent"]["anyOf"]
    assert intents[-1] == {"type": "null"}
    give = intents[0]["properties"]
    assert give["name"] == {"const": "give_item"}
    assert give["args"]["properties"] == {"item": arg_schema("string")}
    assert give["args"]["additionalProperties"] is False
    # an NPC with no intents may propose none: null only
    assert reply_schema(OutputPolicy(structured=True), MAX_LINE_CHARS)["properties"]["intent"] == {
        "anyOf": [{"type": "null"}]}


def test_the_longest_reply_is_every_string_and_list_at_its_bound_and_parses() -> None:
    reply = read_reply(LONGEST)
    assert not isinstance(reply, str), reply
    assert len(reply.say) == MAX_LINE_CHARS
    assert len(reply.beliefs) == INNKEEPER.max_beliefs and len(reply.remember) == INNKEEPER.max_memories
    assert {len(b["text"]) for b in reply.beliefs} == {MAX_PROPOSAL_CHARS} == {len(m["text"]) for m in reply.remember}
    assert reply.intent["name"] == "give_item"
    assert reply_tokens(SCHEMA) == len(LONGEST)
    verdict = judge_reply(LONGEST, make_request().memory, Rules(output=INNKEEPER))
    assert verdict.problem is None and verdict.proposals[0].code == "ok"


def test_the_longest_reply_fits_its_tokens_by_the_models_own_tokenizer() -> None:
    """A token is at least a character: the bundled model's tokenizer counts fewer tokens."""
    pytest.importorskip("llama_cpp")
    path = llamacpp.bundled_model_path()
    if path is None:
        pytest.skip("the model package is not installed (make llm)")
    import llama_cpp

    vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        assert len(vocab.tokenize(LONGEST.encode(), add_bos=False)) <= reply_tokens(SCHEMA)
    finally:
        vocab.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with open_fake_openai(reply=LONGEST) as server:
        yield server


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_the_bounds_reach_the_request_and_the_longest_reply_fits_its_max_tokens(
    fake: FakeOpenAI, endpoint: str,
) -> None:
    options = {"base_url": fake.base_url, "endpoint": endpoint, "max_tokens": 32, "frequency_penalty": 0.5,
               "dry_multiplier": 0.8}
    async with open_pool(PoolConfig(backend="openai", options=options, concurrency=1, timeout=5.0)) as pool:
        result = await pool.infer(msgspec.structs.replace(make_request(), output=INNKEEPER))
        line = await pool.infer(make_request(1))
    body, lined = fake.requests[0]["body"], fake.requests[1]["body"]
    sent = body["response_format"]["json_schema"]["schema"] if endpoint == "chat" else body["json_schema"]
    assert sent == SCHEMA
    assert body["max_tokens"] == reply_tokens(SCHEMA) == result.params["max_tokens"] and lined["max_tokens"] == 32
    assert len(result.attempts) == 1 and result.attempts[0].problem is None and result.line == "x" * MAX_LINE_CHARS
    for sampled in (body, lined, result.params, line.params):  # sent on every request, and recorded
        assert sampled["frequency_penalty"] == 0.5 and sampled["dry_multiplier"] == 0.8
    assert "repeat_penalty" not in body and "presence_penalty" not in body  # unset: not sent


async def test_a_set_structured_max_tokens_is_what_a_structured_request_asks(fake: FakeOpenAI) -> None:
    options = {"base_url": fake.base_url, "structured_max_tokens": 4000}
    async with open_pool(PoolConfig(backend="openai", options=options, concurrency=1, timeout=5.0)) as pool:
        result = await pool.infer(msgspec.structs.replace(make_request(), output=INNKEEPER))
    assert fake.requests[0]["body"]["max_tokens"] == 4000 == result.params["max_tokens"]


async def test_the_in_process_grammar_is_the_bounded_schemas(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    class Model:
        def create_completion(self, prompt: str, **arguments: Any) -> dict[str, Any]:
            calls.append(arguments)
            return {"choices": [{"text": LONGEST}], "usage": {}}

    monkeypatch.setattr(llamacpp, "_grammar", lambda schema: json.loads(schema))
    options = llamacpp.LlamaCppOptions(frequency_penalty=0.3, presence_penalty=0.2)
    backend = llamacpp.LlamaCppBackend(Model(), options, "stand-in")
    reply = await backend.generate(make_request().memory, SCHEMA)
    assert calls[0]["grammar"] == SCHEMA and calls[0]["max_tokens"] == reply_tokens(SCHEMA)
    assert calls[0]["frequency_penalty"] == 0.3 == reply.params["frequency_penalty"]
    assert calls[0]["presence_penalty"] == 0.2 == reply.params["presence_penalty"]
    assert reply.params["max_tokens"] == reply_tokens(SCHEMA) and reply.params["repeat_penalty"] == 1.1


def test_llama_cpps_grammar_of_the_schema_bounds_each_string() -> None:
    """The grammar llama-cpp-python compiles (its own converter): a string's rule holds as many
    characters as its bound, a list's as many items."""
    grammar = pytest.importorskip("llama_cpp.llama_grammar")
    rules = dict(line.split(" ::= ", 1) for line in grammar.json_schema_to_gbnf(json.dumps(SCHEMA)).splitlines())
    chars = {name: len(re.findall(r"\bchar\b", body)) for name, body in rules.items()}
    assert chars["say"] == MAX_LINE_CHARS and chars["beliefs-item-about"] == MAX_NAME_CHARS
    assert chars["beliefs-item-text"] == MAX_PROPOSAL_CHARS == chars["remember-item-text"]
    assert chars["intent-0-args-item"] == MAX_ARG_CHARS
    assert rules["beliefs"].count("beliefs-item") == INNKEEPER.max_beliefs
    assert rules["remember"].count("remember-item") == INNKEEPER.max_memories


def test_a_structured_max_tokens_below_the_longest_reply_is_refused() -> None:
    policies = [None, OutputPolicy(forbidden=("x",)), INNKEEPER]
    check_reply_room("openai", {"base_url": "http://127.0.0.1:1/v1"}, policies, MAX_LINE_CHARS)  # unset: its own
    check_reply_room("openai", {"structured_max_tokens": reply_tokens(SCHEMA)}, policies, MAX_LINE_CHARS)
    check_reply_room("openai", {"structured_max_tokens": 10}, [None], MAX_LINE_CHARS)  # nothing structured
    with pytest.raises(ConfigError) as refused:
        check_reply_room("llamacpp", {"structured_max_tokens": reply_tokens(SCHEMA) - 1}, policies, MAX_LINE_CHARS)
    assert str(refused.value) == (
        f"backend 'llamacpp' options: structured_max_tokens {reply_tokens(SCHEMA) - 1} cannot hold the longest "
        f"structured reply, {reply_tokens(SCHEMA)} tokens (one a character, within the reply schema's bounds): "
        "raise it, or leave it unset")


async def test_a_run_whose_structured_max_tokens_is_too_small_stops_before_it_starts_in_one_line() -> None:
    ran = await asyncio.to_thread(
        run_npcsim, "run", VILLAGE, "--backend", "openai", "--base-url", "http://127.0.0.1:1/v1",
        "--set", "inference.backend_options.structured_max_tokens=160", "--ticks", "1",
        "--broker", "mqtt://127.0.0.1:1",
    )
    assert ran.code != 0
    assert ran.err.strip().splitlines() == [
        f"npcsim: error: backend 'openai' options: structured_max_tokens 160 cannot hold the longest structured "
        f"reply, {reply_tokens(SCHEMA)} tokens (one a character, within the reply schema's bounds): raise it, or "
        "leave it unset"]
