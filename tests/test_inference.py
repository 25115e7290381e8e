"""The inference pool in-process: codecs, fallback, output handling, backpressure, priority, deadlines."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import ConfigError
from sim.inference import (
    GENERIC_LINES,
    InferenceRequest,
    PoolConfig,
    Priority,
    Reply,
    WorkerConfig,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
    fallback_line,
    open_pool,
)
from sim.memory import Fact, WorkingMemory, WorkingMemoryConfig, build_working_memory
from sim.mqtt import BrokerAddress
from sim.output import clean_line, contradicted_fact
from tests.helpers import eventually
from tests.inference_helpers import FALLBACKS, ScriptBackend, make_request, smith_state


def test_players_come_before_npcs_and_npcs_before_ambient_talk() -> None:
    assert Priority.PLAYER < Priority.NPC < Priority.AMBIENT


def test_request_round_trips_through_msgpack_with_its_memory() -> None:
    request = make_request(3, priority=Priority.PLAYER)
    decoded = decode_request(encode_request(request))
    assert decoded == request
    assert decoded.memory.prompt == request.memory.prompt
    with pytest.raises(msgspec.DecodeError):
        decode_request(b"\x81\xa3bad\x01")


def test_fallback_line_is_deterministic_across_processes() -> None:
    lines = ("a", "b", "c", "d", "e")
    here = [fallback_line("mara", tick, 7, lines) for tick in range(20)]
    assert len(set(here)) > 1
    code = f"from sim.inference import fallback_line;print([fallback_line('mara', t, 7, {lines!r}) for t in range(20)])"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == repr(here)
    assert fallback_line("mara", 1, 7, ()) in GENERIC_LINES
    assert fallback_line("mara", 1, 7, ("   ",)) in GENERIC_LINES


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Mara: *wipes her hands* The forge is hot (smiles) today [laughs].\nNext", "The forge is hot today."),
        ("Assistant: As an AI language model I cannot feel. Good day!", "Good day!"),
        ("*nods*\n\"Fine, traveller.\"", "Fine, traveller."),
        ("traveller: mara: Aye.", "Aye."),
        # a quotation keeps its marks, the closing one right after its sentence (no space before it)
        ('I recall that tom said to me: "Go home." It stayed with me.',
         'I recall that tom said to me: "Go home." It stayed with me.'),
        ('Well. I recall that tom said to me: "Go home."', 'Well. I recall that tom said to me: "Go home."'),
        ('"Fine, traveller."', "Fine, traveller."),  # quotes around the whole line go
        ('"Fine, traveller.', "Fine, traveller."),  # and a stray one
        ("Tom said: … and left .", "Tom said: … and left."),  # words left out keep their space
        ("*shrugs*", ""),
        ("   ", ""),
    ],
)
def test_clean_line(raw: str, expected: str) -> None:
    assert clean_line(raw, "mara", 200, ["traveller"]) == expected


# What the issue saw kept after output handling, on the public `say` topic too.
_RAW_ESCAPES = [
    ("Hello\x1b[31m RED \x1b[0m\x07\x00 bell\u202e tfel", "Hello RED bell tfel"),
    ("Hi \x1b[2J\x1b[1;31mSECURITY ALERT\x1b[0m", "Hi SECURITY ALERT"),
    ("\x1b]0;owned\x07Fine\u200b day\u2066, \u2069friend\ufeff.\x9b2J", "Fine day, friend."),
    ("Tab\there\x7f\x85second line", "Tab here"),
]
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


@pytest.mark.parametrize(("raw", "expected"), _RAW_ESCAPES)
def test_clean_line_removes_escapes_controls_bidi_and_zero_width(raw: str, expected: str) -> None:
    assert clean_line(raw, "mara", 200) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from([*"ab .[]*()", "\x1b", "\x07", "\x00", "\x9b", "\x9d", "\\", "\n", "\u202e",
                                 "\u200b", "\u2066", "\t", "m", "2", ";"]), max_size=40))
def test_no_line_said_carries_an_unprintable_character(raw: str) -> None:
    assert not _UNPRINTABLE.search(clean_line(raw, "mara", 200))


def test_clean_line_bounds_length() -> None:
    line = clean_line(" ".join(["word"] * 100), "mara", 50)
    assert len(line) <= 50 and line.endswith("…")
    assert clean_line("Short one. " + "x" * 100, "mara", 60) == "Short one."


@pytest.mark.parametrize(
    ("line", "negates"),
    [
        ("The old bridge is not broken!", True),
        ("Nay, the old bridge isn't broken.", True),
        ("The old bridge is never broken, not really.", True),
        ("Tom is not the mayor of the village.", True),
        ("Aye, the old bridge is broken.", False),
        ("No, the old bridge is broken, stay off it.", False),
        ("The well is fine.", False),
    ],
)
def test_negation_check(line: str, negates: bool) -> None:
    facts = [Fact(id="f1", text="The old bridge is broken."), Fact(id="f2", text="Tom is the mayor of the village.")]
    assert (contradicted_fact(line, facts) is not None) == negates


def test_negation_of_a_negative_fact() -> None:
    facts = [Fact(id="w", text="The well is not poisoned")]
    assert contradicted_fact("Beware, the well is poisoned!", facts) == facts[0]
    assert contradicted_fact("The well is not poisoned, drink.", facts) is None


async def test_scripted_reply_proves_the_context_reached_the_worker() -> None:
    async with open_pool(PoolConfig(backend="scripted", concurrency=2)) as pool:
        result = await pool.infer(make_request())
    assert not result.fallback and result.fallback_reason is None
    request = make_request()
    kept = [f.text.rstrip(".") for f in request.memory.canonical_facts]
    kept += [b.text[1:].rstrip(".") for b in request.memory.beliefs]
    kept += [e.text.rstrip(".") for e in request.memory.episodic]
    assert any(text in result.line for text in kept), result.line  # it names something it was given
    assert result.backend == "scripted" and result.worker == "inprocess"
    assert {"queue_ms", "backend_ms", "total_ms"} <= set(result.timings)
    assert decode_result(encode_result(result)) == result


async def test_negating_reply_is_retried_with_a_prohibition_then_accepted() -> None:
    backend = ScriptBackend(["The old bridge is not broken at all.", "Mind the bridge, it's broken."])
    async with open_pool(PoolConfig(), backend=backend) as pool:
        result = await pool.infer(make_request())
        stats = pool.statistics()
    assert not result.fallback and result.line == "Mind the bridge, it's broken."
    assert backend.prohibitions[0] is None
    assert backend.prohibitions[1] is not None and "The old bridge is broken." in backend.prohibitions[1]
    assert stats.rejected_outputs == 1
    first, second = result.attempts
    assert first.raw_response == "The old bridge is not broken at all."
    assert first.problem == "negates canonical fact 'f1'"
    assert second.problem is None and second.prohibition == backend.prohibitions[1]
    assert "\n## Rule\n" not in first.prompt and f"\n## Rule\n{second.prohibition}\n" in second.prompt
    assert len(second.prompt) <= WorkingMemoryConfig().max_context_chars


async def test_a_rejected_reply_without_the_state_is_not_retried() -> None:
    backend = ScriptBackend(["The old bridge is not broken at all.", "never asked"])
    async with open_pool(PoolConfig(), backend=backend) as pool:
        result = await pool.infer(msgspec.structs.replace(make_request(), state=None, config=None))
    assert result.fallback and result.fallback_reason == "rejected"
    assert backend.prohibitions == [None] and len(result.attempts) == 1


async def test_the_retry_makes_room_for_its_rule_inside_the_budget() -> None:
    state = smith_state()
    said = "traveller: Is the bridge safe to cross?"
    first = build_working_memory(state, said, WorkingMemoryConfig())
    config = WorkingMemoryConfig(max_context_chars=len(first.prompt))  # the first attempt fills the budget
    request = msgspec.structs.replace(
        make_request(said=said), memory=build_working_memory(state, said, config), config=config
    )
    backend = ScriptBackend(["The old bridge is not broken at all.", "Aye, it's broken."])
    async with open_pool(PoolConfig(), backend=backend) as pool:
        result = await pool.infer(request)
    retry = build_working_memory(state, said, config, prohibition=result.attempts[1].prohibition)
    assert retry.prompt == result.attempts[1].prompt and not retry.report.over_budget
    assert len(retry.prompt) <= config.max_context_chars
    assert retry.report.dialogue.kept + retry.report.beliefs.kept < 2  # flexible items made room


async def test_no_retry_when_its_rule_cannot_fit_the_budget() -> None:
    state = smith_state()
    said = "traveller: Is the bridge safe to cross?"
    bare = build_working_memory(state, said, WorkingMemoryConfig(max_context_chars=10))  # mandatory only
    config = WorkingMemoryConfig(max_context_chars=bare.report.mandatory_chars)
    request = msgspec.structs.replace(
        make_request(said=said), memory=build_working_memory(state, said, config), config=config
    )
    assert not request.memory.report.over_budget
    backend = ScriptBackend(["The old bridge is not broken at all.", "never asked"])
    async with open_pool(PoolConfig(), backend=backend) as pool:
        result = await pool.infer(request)
    assert result.fallback and result.fallback_reason == "rejected" and len(result.attempts) == 1


async def test_twice_rejected_reply_becomes_the_fallback() -> None:
    backend = ScriptBackend(["The old bridge is not broken.", "*stares*"])
    async with open_pool(PoolConfig(), backend=backend) as pool:
        request = make_request(5)
        result = await pool.infer(request)
        stats = pool.statistics()
    assert result.fallback and result.fallback_reason == "rejected"
    assert result.line == fallback_line("mara", 5, 7, FALLBACKS)
    assert result.raw_response == "*stares*"
    assert stats.fallbacks == {"rejected": 1} and stats.rejected_outputs == 2 and stats.attempts == 2
    assert [a.problem for a in result.attempts] == ["negates canonical fact 'f1'", "empty"]


async def test_backend_error_gives_the_fallback_never_raises() -> None:
    from sim.errors import InferenceError

    async with open_pool(PoolConfig(), backend=ScriptBackend([], fail=InferenceError("model exploded"))) as pool:
        results = [await pool.infer(make_request(n)) for n in range(3)]
        stats = pool.statistics()
    assert all(r.fallback and r.fallback_reason == "backend_error" for r in results)
    assert all(r.line in FALLBACKS for r in results)
    assert stats.fallbacks == {"backend_error": 3} and stats.requests == 3 and stats.completed == 3


async def test_a_slow_backend_times_out_into_the_fallback() -> None:
    config = PoolConfig(backend="scripted", options={"delay_ms": 5000}, timeout=0.1)
    async with open_pool(config) as pool:
        result = await pool.infer(make_request())
    assert result.fallback and result.fallback_reason == "timeout"


async def test_stale_requests_are_dropped_without_calling_the_backend() -> None:
    backend = ScriptBackend(["never said"])
    async with open_pool(PoolConfig(), backend=backend) as pool:
        result = await pool.infer(make_request(deadline_in=-1.0))
        stats = pool.statistics()
    assert result.fallback and result.fallback_reason == "stale"
    assert backend.prohibitions == []
    assert stats.dropped_stale == 1 and stats.fallbacks == {"stale": 1}


class GatedBackend:
    """Holds every call until released, recording the order agents were served in."""

    name = "gated"
    model = "gated"
    prompt_form = "text"
    prompt_prefix = ""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.served: list[str] = []

    async def generate(self, memory: WorkingMemory, schema: Mapping[str, Any] | None = None) -> Reply:
        self.served.append(memory.agent_id)
        await self.gate.wait()
        return Reply(text=f"{memory.agent_id} speaks.", model=self.model)


async def test_full_pool_applies_backpressure_and_serves_players_first() -> None:
    backend = GatedBackend()
    config = PoolConfig(concurrency=2, max_in_flight=2)
    async with open_pool(config, backend=backend) as pool:
        async with asyncio.TaskGroup() as tg:
            for n in range(2):
                tg.create_task(pool.infer(make_request(n, agent=f"busy{n}", priority=Priority.AMBIENT)))
            await eventually(lambda: pool.statistics().in_flight == 2, what="two in flight")
            for n in range(3):
                tg.create_task(pool.infer(make_request(n, agent=f"ambient{n}", priority=Priority.AMBIENT)))
            tg.create_task(pool.infer(make_request(0, agent="npc0", priority=Priority.NPC)))
            tg.create_task(pool.infer(make_request(0, agent="player0", priority=Priority.PLAYER)))
            await eventually(lambda: pool.statistics().waiting == 5, what="five waiting")
            assert pool.statistics().in_flight == 2  # backpressure: nobody got past the bound
            backend.gate.set()
        stats = pool.statistics()
    assert backend.served[2:] == ["player0", "npc0", "ambient0", "ambient1", "ambient2"]
    assert stats.in_flight_peak == 2 and stats.in_flight == 0 and stats.waiting == 0 and stats.completed == 7


async def test_a_cancelled_waiter_gives_up_its_place() -> None:
    backend = GatedBackend()
    async with open_pool(PoolConfig(concurrency=1), backend=backend) as pool:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(pool.infer(make_request(0, agent="first")))
            await eventually(lambda: pool.statistics().in_flight == 1, what="one in flight")
            doomed = tg.create_task(pool.infer(make_request(0, agent="doomed", priority=Priority.PLAYER)))
            tg.create_task(pool.infer(make_request(0, agent="later")))
            await eventually(lambda: pool.statistics().waiting == 2, what="two waiting")
            doomed.cancel()
            await eventually(lambda: pool.statistics().waiting == 1, what="one waiting")
            backend.gate.set()
        assert pool.statistics().in_flight == 0
    assert backend.served == ["first", "later"]


async def test_waiters_cancelled_together_leave_the_slots_whole() -> None:
    """A stop cancels every turn at once: a release that runs before the cancelled waiters do
    drops their entries, and none of them may then fail looking for its own."""
    from sim.inference._counters import Counters
    from sim.inference._pool import Slots

    counters = Counters()
    slots = Slots(1, counters)
    await slots.acquire(Priority.NPC)
    waiters = [asyncio.create_task(slots.acquire(Priority.NPC)) for _ in range(10)]
    await eventually(lambda: counters.waiting == 10, what="ten waiting")
    for waiter in waiters:
        waiter.cancel()
    slots.release()  # before the waiters' own handlers run: every entry it finds is a waiter gone
    outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert (counters.in_flight, counters.waiting) == (0, 0)
    await asyncio.wait_for(slots.acquire(Priority.NPC), 1)  # the slot is free again
    assert counters.in_flight == 1


def test_pool_config_refuses_bad_values() -> None:
    with pytest.raises(ConfigError, match="concurrency"):
        PoolConfig(concurrency=0)
    with pytest.raises(ConfigError, match="transport"):
        PoolConfig(transport="carrier-pigeon")  # type: ignore[arg-type]
    assert PoolConfig(concurrency=4, max_in_flight=2).slots == 2


@pytest.mark.parametrize("name", ["a/b", "w+", "#", "x\x00y"])
def test_a_worker_name_must_name_its_status_topic(name: str) -> None:
    """The name is the last segment of the worker's last-will topic (infer/worker/{name})."""
    with pytest.raises(ConfigError, match=r"--name: worker name .* cannot be used in an MQTT topic"):
        WorkerConfig(broker=BrokerAddress.parse("mqtt://127.0.0.1:1883"), run_id="r", name=name)


async def test_unknown_backend_and_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown backend 'gpt-9'"):
        async with open_pool(PoolConfig(backend="gpt-9")):
            pass
    with pytest.raises(ConfigError, match="scripted"):
        async with open_pool(PoolConfig(backend="scripted", options={"dealy_ms": 5})):
            pass


def test_inference_request_forbids_unknown_fields() -> None:
    request = make_request()
    data = msgspec.to_builtins(request)
    data["surprise"] = 1
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(data, InferenceRequest)
