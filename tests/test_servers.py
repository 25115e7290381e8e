"""Several model servers: each NPC on its own server, and on the next when that one dies
(two fake OpenAI-compatible servers on loopback, real HTTP)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sim.errors import ConfigError
from sim.inference import PoolConfig, open_pool
from sim.inference.backends.servers import each_server, open_servers, shown_url
from sim.inference.backends.spread import rendezvous_order
from sim.wire.inference import InferenceResult
from tests.fake_openai import open_fake_openai
from tests.helpers import eventually
from tests.inference_helpers import make_request

AGENTS = [f"npc{n}" for n in range(24)]


def server_of(result: InferenceResult) -> str | None:
    served = result.attempts[-1].served_by
    return None if served is None else served.server


def pool_config(urls: list[str], **options: Any) -> PoolConfig:
    return PoolConfig(backend="openai", options={"base_url": urls, "model": "fake-1", **options},
                      concurrency=len(AGENTS), timeout=20.0)


async def test_each_npc_is_answered_by_its_own_server_and_by_the_other_once_that_one_dies() -> None:
    async with open_fake_openai() as survivor:
        victim_context = open_fake_openai()
        victim = await victim_context.__aenter__()
        try:
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
                await victim_context.__aexit__(None, None, None)
                after_kill = await asyncio.gather(*middle)
                later = await asyncio.gather(*(pool.infer(make_request(2, agent=a)) for a in AGENTS))
        finally:
            await victim_context.__aexit__(None, None, None)
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
