"""The pool answering a request from its record (`open_pool(..., recorded=...)`): the same result
as the call recorded, attempt by attempt, whatever the call met; other requests go to the backend."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from sim.audit import AuditRecord, Response, make_record
from sim.errors import BackendTimeoutError, CircuitOpenError, InferenceError
from sim.inference import InferenceRequest, InferenceResult, PoolConfig, open_pool
from tests.inference_helpers import ScriptBackend, make_request


def record_of(request: InferenceRequest, result: InferenceResult) -> AuditRecord:
    assert request.state is not None and request.config is not None
    response = Response(backend=result.backend, model=result.model, params=result.params,
                        line=result.line, fallback=result.fallback,
                        fallback_reason=result.fallback_reason, attempts=result.attempts)
    return make_record(request.memory, id=request.id, run_id=request.run_id, state=request.state,
                       config=request.config, tick=request.tick, response=response)


def same(a: InferenceResult, b: InferenceResult) -> None:
    assert (b.line, b.fallback, b.fallback_reason, b.backend, b.model) == (
        a.line, a.fallback, a.fallback_reason, a.backend, a.model)
    assert [(x.prompt, x.raw_response, x.problem, x.prohibition) for x in b.attempts] == [
        (x.prompt, x.raw_response, x.problem, x.prohibition) for x in a.attempts]


CASES: dict[str, Callable[[], ScriptBackend]] = {
    "accepted": lambda: ScriptBackend(["Aye, the bridge holds."]),
    "retried": lambda: ScriptBackend(["*shrugs*", "Cross it slowly."]),
    "rejected twice": lambda: ScriptBackend(["*shrugs*", "(sighs)"]),
    "timeout": lambda: ScriptBackend([], fail=BackendTimeoutError("no answer within 2.00s")),
    "open circuit": lambda: ScriptBackend([], fail=CircuitOpenError("5 failures in a row")),
    "backend error": lambda: ScriptBackend([], fail=InferenceError("HTTP 500")),
}


@pytest.mark.parametrize("case", CASES)
async def test_a_recorded_call_is_answered_as_it_went(case: str) -> None:
    request = make_request(1)
    async with open_pool(PoolConfig(), backend=CASES[case]()) as pool:
        first = await pool.infer(request)
    never = ScriptBackend([], fail=AssertionError("the live backend was asked"))
    async with open_pool(PoolConfig(), backend=never, recorded=lambda r: record_of(request, first)) as pool:
        again = await pool.infer(request)
    same(first, again)
    assert never.prohibitions == []


async def test_a_stale_request_gets_its_fallback_again_and_the_unrecorded_go_live() -> None:
    stale = make_request(2, deadline_in=-1.0)
    async with open_pool(PoolConfig(), backend=ScriptBackend([])) as pool:
        first = await pool.infer(stale)
    assert first.fallback_reason == "stale" and not first.attempts
    live = ScriptBackend(["Mind the gap in the planks."])
    fresh = make_request(2)  # the same id, in time now
    other = make_request(3)
    recorded = {stale.id: record_of(stale, first)}
    async with open_pool(PoolConfig(), backend=live, recorded=lambda r: recorded.get(r.id)) as pool:
        same(first, await pool.infer(fresh))
        assert (await pool.infer(other)).line == "Mind the gap in the planks."


async def test_more_attempts_than_recorded_fall_back() -> None:
    request = make_request(4)
    async with open_pool(PoolConfig(), backend=ScriptBackend(["Aye."])) as pool:
        first = await pool.infer(request)
    recorded = record_of(request, first)
    changed = msgspec.structs.replace(
        recorded, attempts=(msgspec.structs.replace(recorded.attempts[0], raw_response="*nods*"),))
    async with open_pool(PoolConfig(), backend=ScriptBackend([]), recorded=lambda r: changed) as pool:
        again = await pool.infer(request)
    assert again.fallback and again.fallback_reason == "backend_error"
    assert [a.problem for a in again.attempts] == ["empty", "backend_error: no recorded reply for attempt 2"]
