"""Several model servers: each NPC on its own server, and on the next when that one dies
(two fake OpenAI-compatible servers on loopback, real HTTP)."""

from __future__ import annotations

import argparse
import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sim.audit import AuditRecord
from sim.cli._options import add_backend_arguments, backend_options
from sim.cli.run import summary_rows
from sim.errors import ConfigError, ScenarioError
from sim.inference import PoolConfig, open_pool
from sim.inference.backends.servers import each_server, open_servers, shown_url
from sim.inference.backends.spread import SlotTable, rendezvous_order
from sim.inference.backends.tokenize import open_server_tokenizer
from sim.memory import Fact, Line, WorkingMemory, WorkingMemoryConfig, build_working_memory
from sim.scenario import parse_scenario, read_scenario
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, run
from sim.shard._run_config import with_servers
from sim.store import open_reader
from sim.wire.inference import InferenceResult
from tests.fake_openai import open_fake_openai
from tests.helpers import VILLAGE, MosquittoProcess, eventually
from tests.inference_helpers import make_request, smith_state
from tests.llama_server import SLOTS, LlamaServer

AGENTS = [f"npc{n}" for n in range(24)]


def server_of(result: InferenceResult) -> str | None:
    served = result.attempts[-1].served_by
    return None if served is None else served.server


def pool_config(urls: list[str], **options: Any) -> PoolConfig:
    return PoolConfig(backend="openai", options={"base_url": urls, "model": "fake-1", **options},
                      concurrency=len(AGENTS), timeout=20.0)


async def test_each_npc_is_answered_by_its_own_server_and_by_the_other_once_that_one_dies() -> None:
    async with open_fake_openai() as survivor, AsyncExitStack() as victim_lives:
        victim = await victim_lives.enter_async_context(open_fake_openai())
        urls = [victim.base_url, survivor.base_url]
        async with open_pool(pool_config(urls)) as pool:
            first = await asyncio.gather(*(pool.infer(make_request(0, agent=a)) for a in AGENTS))
            assert [server_of(r) for r in first] == [rendezvous_order(a, urls)[0] for a in AGENTS]
            assert {server_of(r) for r in first} == set(urls)  # both servers have NPCs
            victims = [a for a in AGENTS if rendezvous_order(a, urls)[0] == victim.base_url]

            victim.delay_s = 60.0  # its next replies are in flight when it dies
            asked = len(victim.requests)
            middle = [asyncio.create_task(pool.infer(make_request(1, agent=a))) for a in AGENTS]
            await eventually(lambda: len(victim.requests) >= asked + len(victims),
                             what="the victim's NPCs' requests in flight at it")
            await victim_lives.aclose()
            after_kill = await asyncio.gather(*middle)
            later = await asyncio.gather(*(pool.infer(make_request(2, agent=a)) for a in AGENTS))
    for result in [*after_kill, *later]:
        assert not result.fallback, result.fallback_reason
        assert server_of(result) == survivor.base_url
        assert len(result.attempts) == 1  # the failover is inside one call, not a retry of the pool's


async def test_with_one_server_down_from_the_start_every_npc_is_answered_by_the_other() -> None:
    async with open_fake_openai() as up:
        async with open_fake_openai() as gone:
            down = gone.base_url
        async with open_pool(pool_config([down, up.base_url], retries=0)) as pool:
            results = await asyncio.gather(*(pool.infer(make_request(0, agent=a)) for a in AGENTS))
    assert all(not r.fallback and server_of(r) == up.base_url for r in results)


async def test_every_server_down_is_the_fallback_line() -> None:
    async with open_fake_openai() as one, open_fake_openai() as two:
        urls = [one.base_url, two.base_url]
    async with open_pool(pool_config(urls, retries=0)) as pool:
        result = await pool.infer(make_request(0))
    assert result.fallback and result.fallback_reason in ("backend_error", "circuit_open")


async def test_a_server_that_says_it_is_overloaded_gets_fewer_requests_at_once() -> None:
    async with open_fake_openai() as fake:
        fake.script = ["429"] * 3
        async with open_servers({"base_url": fake.base_url, "retries": 3}, concurrency=16) as backend:
            await backend.generate(make_request(0).memory)
            assert backend.limits() == {fake.base_url: 11}  # 16 x 0.7 once: the retries were one round


@pytest.mark.parametrize("urls", [[], [1], ["http://a/v1", "http://a/v1"]])
def test_a_list_of_servers_that_is_not_one_is_a_config_error(urls: list[Any]) -> None:
    with pytest.raises(ConfigError, match="base_url"):
        each_server({"base_url": urls})


def test_a_server_named_with_a_login_is_shown_without_it() -> None:
    assert shown_url("http://user:secret@10.0.0.1:8080/v1?x=1#frag") == "http://10.0.0.1:8080/v1?x=1"
    assert shown_url("https://[::1]/v1") == "https://[::1]/v1"


@pytest.mark.mosquitto
async def test_a_run_whose_server_dies_mid_run_is_answered_by_the_other(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """Both servers hold their answers; the first to be asked dies with that request in flight,
    and every record of the run says the other answered it, without a fallback line."""
    db = tmp_path / "two.db"
    async with AsyncExitStack() as first_life, AsyncExitStack() as second_life:
        lives = {}
        for life in (first_life, second_life):
            fake = await life.enter_async_context(open_fake_openai())
            fake.held.clear()
            lives[fake.base_url] = (fake, life)
        config = RunConfig(
            scenario=VILLAGE, run_id="two", ticks=12, broker=BrokerConfig(url=mosquitto.url),
            record=RecordConfig(db=str(db)),
            inference=InferenceConfig(backend="openai", backend_options={"base_url": list(lives)}),
        )
        stats = RunStats()
        running = asyncio.create_task(run(config, stats=stats))
        asked = await eventually(lambda: [url for url, (f, _) in lives.items() if f.requests], what="a request")
        victim_life = lives.pop(asked[0])[1]
        (survivor, _), = lives.values()
        killed_at = stats.tick
        await victim_life.aclose()
        survivor.held.set()
        await running
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert records and killed_at < 11 and not any(r.fallback for r in records)
    assert {server_of_record(r) for r in records} == {survivor.base_url}
    rows = dict(summary_rows(stats))
    assert rows[f"answered by {survivor.base_url}"] == str(len(records))
    assert 1 <= int(rows[f"in flight at most: {survivor.base_url}"]) <= config.inference.concurrency


def server_of_record(record: AuditRecord) -> str | None:
    served = record.attempts[-1].served_by
    return None if served is None else served.server


def test_the_scenario_names_the_servers_when_the_run_names_none() -> None:
    scenario = parse_scenario(read_scenario("village").data + b'\n[inference]\nservers = ["http://a:1/v1", "http://b:2/v1"]\n')
    given = RunConfig(scenario="village", inference=InferenceConfig(backend="openai"))
    assert with_servers(given, scenario).inference.backend_options == {"base_url": ["http://a:1/v1", "http://b:2/v1"]}
    named = RunConfig(scenario="village", inference=InferenceConfig(backend="openai",
                                                                    backend_options={"base_url": "http://c:3/v1"}))
    assert with_servers(named, scenario) == named  # --base-url wins


@pytest.mark.parametrize("servers", ['["ftp://a/v1"]', '["http://a b/v1"]', '"http://a/v1"'])
def test_a_scenario_server_that_is_not_an_http_url_is_refused(servers: str) -> None:
    with pytest.raises(ScenarioError, match="inference"):
        parse_scenario(read_scenario("village").data + f"\n[inference]\nservers = {servers}\n".encode())


def test_base_url_given_twice_is_a_list_of_servers() -> None:
    parser = argparse.ArgumentParser()
    add_backend_arguments(parser)
    one = parser.parse_args(["--backend", "openai", "--base-url", "http://a/v1"])
    two = parser.parse_args(["--backend", "openai", "--base-url", "http://a/v1", "--base-url", "http://b/v1"])
    assert backend_options(one) == {"base_url": "http://a/v1"}
    assert backend_options(two) == {"base_url": ["http://a/v1", "http://b/v1"]}
    slotted = parser.parse_args(["--backend", "openai", "--base-url", "http://a/v1", "--slot-affinity"])
    assert backend_options(slotted) == {"base_url": "http://a/v1", "slot_affinity": True}
    reusing = parser.parse_args(["--backend", "openai", "--base-url", "http://a/v1", "--cache-reuse", "16"])
    assert backend_options(reusing) == {"base_url": "http://a/v1", "cache_reuse": 16}


@pytest.mark.parametrize("value", ["0", "-4", "many", "1.5"])
def test_a_cache_reuse_that_is_not_a_positive_whole_number_is_refused(
    value: str, capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser()
    add_backend_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", "openai", "--cache-reuse", value])
    assert "--cache-reuse" in capsys.readouterr().err


async def test_a_negative_cache_reuse_option_is_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match="cache_reuse") as caught:
        async with open_servers({"base_url": "http://127.0.0.1:9/v1", "cache_reuse": -1}, concurrency=1):
            pass
    assert "\n" not in str(caught.value)


async def test_cache_reuse_is_sent_as_n_cache_reuse_and_recorded_only_when_set() -> None:
    async with open_fake_openai() as fake:
        async with open_servers({"base_url": fake.base_url, "cache_reuse": 16}, concurrency=1) as backend:
            reusing = await backend.generate(make_request(0).memory)
        async with open_servers({"base_url": fake.base_url}, concurrency=1) as backend:
            plain = await backend.generate(make_request(0).memory)
    assert fake.requests[0]["body"]["n_cache_reuse"] == 16 and reusing.params["cache_reuse"] == 16
    assert "n_cache_reuse" not in fake.requests[1]["body"] and "cache_reuse" not in plain.params


async def test_with_slot_affinity_each_npc_keeps_its_own_slot_of_the_server() -> None:
    async with open_fake_openai() as fake:
        fake.total_slots = 4
        async with open_servers({"base_url": fake.base_url, "slot_affinity": True}, concurrency=4) as backend:
            for tick in range(2):
                for agent in AGENTS:
                    await backend.generate(make_request(tick, agent=agent).memory)
        async with open_servers({"base_url": fake.base_url}, concurrency=4) as backend:
            await backend.generate(make_request(0).memory)
    slots = [r["body"]["id_slot"] for r in fake.requests[:-1]]
    assert slots[: len(AGENTS)] == slots[len(AGENTS):]  # the same slot for the same NPC, tick after tick
    assert set(slots) == {0, 1, 2, 3}  # the NPCs spread over the slots
    assert "id_slot" not in fake.requests[-1]["body"]  # off by default


def test_the_first_npcs_take_a_slot_each_and_the_others_share_by_hashing() -> None:
    table = SlotTable(4)
    first = [table.slot(agent) for agent in ["smith", "innkeeper", "guard"]]
    assert first == [0, 1, 2]  # three NPCs on four slots: none shares
    assert [table.slot(agent) for agent in ["guard", "smith", "innkeeper"]] == [2, 0, 1]  # each keeps its own
    assert table.slot("priest") == 3
    late = {agent: table.slot(agent) for agent in AGENTS}
    assert late == {agent: int(rendezvous_order(agent, ["0", "1", "2", "3"])[0]) for agent in AGENTS}
    assert late == {agent: table.slot(agent) for agent in AGENTS}  # tick after tick


async def test_an_npcs_own_slot_keeps_the_prompts_fixed_part_on_a_shift() -> None:
    async with open_fake_openai() as fake:
        fake.total_slots = 4
        options = {"base_url": fake.base_url, "endpoint": "completions", "slot_affinity": True}
        async with open_servers(options, concurrency=1) as backend:
            memory = make_request(0).memory
            for _ in range(2):
                await backend.generate(memory)
        async with open_servers({**options, "endpoint": "chat"}, concurrency=1) as backend:
            await backend.generate(memory)
    fixed = memory.prompt[: memory.system_chars]
    assert [body["content"] for body in fake.tokenized] == [fixed]  # asked once, kept
    keeps = [request["body"].get("n_keep") for request in fake.requests]
    assert keeps[:2] == [len(fixed.split()), len(fixed.split())] and keeps[2] is None  # chat: the template's


async def test_the_budgets_server_tokenizer_counts_the_fixed_part_too() -> None:
    async with open_fake_openai() as fake:
        fake.total_slots = 4
        options = {"base_url": fake.base_url, "endpoint": "completions", "slot_affinity": True}
        async with open_server_tokenizer(options) as tokenizer, open_servers(options, concurrency=1,
                                                                             tokenizer=tokenizer) as backend:
            (server,) = backend.servers.values()
            assert server.keeping is tokenizer  # one client and one cache for the server's counts
            memory = make_request(0).memory
            await tokenizer.fetch([memory.prompt[: memory.system_chars]])
            await backend.generate(memory)
    assert len(fake.tokenized) == 1 and fake.requests[0]["body"]["n_keep"] > 0  # counted once


async def test_slot_affinity_on_a_server_that_does_not_say_its_slots_sends_no_slot() -> None:
    async with open_fake_openai() as fake:
        options = {"base_url": fake.base_url, "slot_affinity": True}
        async with open_servers(options, concurrency=4) as backend:
            await backend.generate(make_request(0).memory)
    assert "id_slot" not in fake.requests[0]["body"]


async def test_llama_servers_slots_are_read_and_each_npc_meets_its_prompt_in_its_slot(
    llama_server: LlamaServer,
) -> None:
    options = {"base_url": llama_server.base_url, "endpoint": "completions", "slot_affinity": True, "max_tokens": 8}
    async with open_servers(options, concurrency=SLOTS) as backend:
        (server,) = backend.servers.values()
        assert len(server.slots) == SLOTS
        agents = AGENTS[:SLOTS]
        for _ in range(2):
            replies = [await backend.generate(make_request(0, agent=a).memory) for a in agents]
    for reply in replies:  # the second round: each prompt again, in the slot that kept it
        usage = reply.usage
        assert usage.prompt_tokens and usage.cached_tokens and usage.cached_tokens >= usage.prompt_tokens // 2


def _talked_to(bridge: str) -> WorkingMemory:
    """The smith's memory with the first fact changed: everything after it is the same text."""
    state = smith_state("npc0")
    facts = (Fact(id="f1", text=bridge), *state.canonical_facts[1:])
    dialogue = tuple(Line(tick=t, speaker="traveller", text=f"Tell me about the {thing}, smith, and its price.")
                     for t, thing in enumerate(("plough", "horseshoes", "gate hinges", "cart axle", "nails")))
    return build_working_memory(msgspec.structs.replace(state, canonical_facts=facts, dialogue=dialogue),
                                "traveller: Is the bridge safe to cross?", WorkingMemoryConfig())


async def test_with_cache_reuse_llama_server_reuses_what_follows_a_changed_line(llama_server: LlamaServer) -> None:
    before, after = _talked_to("The old bridge is broken."), _talked_to("The old bridge was mended by Tom.")
    cached: dict[int, int] = {}
    for reuse in (0, 16):
        options = {"base_url": llama_server.base_url, "endpoint": "completions", "slot_affinity": True,
                   "max_tokens": 4, "temperature": 0.0, "cache_reuse": reuse}
        async with open_servers(options, concurrency=1) as backend:
            await backend.generate(before)
            reply = await backend.generate(after)  # the same slot: it holds `before`
        assert reply.usage.cached_tokens is not None
        cached[reuse] = reply.usage.cached_tokens
    assert cached[16] > cached[0]  # past the shared prefix, the chunks after the changed fact
