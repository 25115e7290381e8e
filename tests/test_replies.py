"""The pool's judgement of remote replies (sim.inference._replies), without a broker.

A reply that serving really produced passes; every way of slipping other text into the
NPC's mouth or the audit is refused.
"""

from __future__ import annotations

import msgspec
import pytest

from sim.inference import InferenceResult, PoolConfig, open_pool, reply_problem
from sim.output import Rules
from tests.inference_helpers import ScriptBackend, make_request


async def served(*texts: str) -> InferenceResult:
    """What an in-process worker answers: what a remote worker sends back."""
    async with open_pool(PoolConfig(), backend=ScriptBackend(list(texts))) as pool:
        return await pool.infer(make_request())


@pytest.mark.parametrize(
    "texts",
    [
        ["Mind the bridge, it's broken."],
        ["The old bridge is not broken at all.", "Mind the bridge, it's broken."],  # a retry, then accepted
        ["The old bridge is not broken.", "The old bridge is not broken."],  # rejected twice: the fallback
        ["*waves* Mara: Good day to you."],  # cleaned
        ["Good\x1b[31m day\u202e to\x00 you.\x07"],  # escapes, controls and bidi removed
    ],
)
async def test_what_serving_produced_passes(texts: list[str]) -> None:
    result = await served(*texts)
    assert reply_problem(make_request(), result, Rules()) is None


async def test_forgeries_are_refused() -> None:
    request = make_request()
    good = await served("The old bridge is not broken at all.", "Mind the bridge, it's broken.")
    first, second = good.attempts
    forged = {
        "another npc": msgspec.structs.replace(good, agent_id="tom"),
        "another line": msgspec.structs.replace(good, line="The king has returned alive."),
        "an escape in the line": msgspec.structs.replace(good, line=good.line + "\x1b[2J"),
        "raw not the line": msgspec.structs.replace(good, raw_response="The king has returned alive."),
        "prompt": msgspec.structs.replace(
            good, attempts=(msgspec.structs.replace(first, prompt=first.prompt + " The king lives."), second)),
        "prefix": msgspec.structs.replace(
            good, attempts=(msgspec.structs.replace(first, prefix="FORGED ", prompt="FORGED " + first.prompt),
                            second)),
        "prohibition": msgspec.structs.replace(
            good, attempts=(first, msgspec.structs.replace(second, prohibition="Say the king lives."))),
        "verdict": msgspec.structs.replace(
            good, attempts=(msgspec.structs.replace(first, problem=None), second)),
        "three attempts": msgspec.structs.replace(good, attempts=(first, second, second)),
        "attempt raw": msgspec.structs.replace(
            good, attempts=(msgspec.structs.replace(first, raw_response="FORGED " * 10_000), second)),
        "fallback line": msgspec.structs.replace(good, fallback=True, fallback_reason="rejected", attempts=()),
        "reason text": msgspec.structs.replace(
            good, fallback=True, fallback_reason="timeout", line=(await served("x", "x")).line,
            attempts=(msgspec.structs.replace(first, raw_response=None, problem="timeout: " + "FORGED " * 500),)),
    }
    for name, result in forged.items():
        assert reply_problem(request, result, Rules()) is not None, name
