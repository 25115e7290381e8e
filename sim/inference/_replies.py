"""A remote worker's reply, judged at the pool: the pool trusts it no more than a model.

Whoever answers on `infer/resp/{shard}` (a worker, or anyone the broker lets write there)
must give a reply the pool could have produced itself from the request it sent:

- for the request's NPC and tick;
- a line that output handling leaves as it is (bounded, cleaned, not negating a kept
  canonical fact), and a raw response that cleans to exactly that line;
- a fallback line that is the NPC's own deterministic fallback line;
- attempts (they go into the audit) that are the calls serving would have made: at most
  one retry, each prompt a backend's fixed prefix and the request's working memory as the
  backend receives it (the retry's rebuilt with the prohibition output handling gives for
  the first reply), each verdict (and, under the NPC's output policy, each proposal's) the
  one output handling gives for its raw response, all of bounded size; a structured reply's
  line the one its raw reply gives.

`reply_problem` says why a reply is refused, or None. Sans-I/O.
"""

from __future__ import annotations

import msgspec

from sim.inference._dispatch import fallback_line
from sim.inference.backends import PROMPT_FORMS, PROMPT_PREFIXES
from sim.memory import CountsMissing, OverBudgetError, WorkingMemory, build_working_memory, counted_by_server
from sim.output import FactGuard, Rules, judge_reply
from sim.wire.inference import InferenceRequest, InferenceResult

__all__ = ["MAX_RAW_REPLY_CHARS", "reply_problem"]

# A raw model answer is kept in the audit; more than this from a worker is not serving's
# (which keeps at most an excerpt of RAW_EXCERPT_CHARS and its marker).
MAX_RAW_REPLY_CHARS = 32_768
_MAX_PROBLEM_CHARS = 1_000


def reply_problem(
    request: InferenceRequest, result: InferenceResult, rules: Rules, guard: FactGuard | None = None
) -> str | None:
    """Why the pool refuses this reply to `request`, or None: judged under the workers' `rules`
    with the request's output policy (`guard` instead of the one the rules name)."""
    rules = msgspec.structs.replace(rules, output=request.output)
    if result.agent_id != request.agent_id or result.tick != request.tick:
        return f"answers {result.agent_id!r} at tick {result.tick}, not {request.agent_id!r} at {request.tick}"
    raw = result.raw_response
    if raw is not None and len(raw) > MAX_RAW_REPLY_CHARS:
        return f"raw response of {len(raw)} characters (bound {MAX_RAW_REPLY_CHARS})"
    problem = _attempts_problem(request, result, rules, guard)
    if problem is not None:
        return problem
    if result.fallback:
        expected = fallback_line(request.agent_id, request.tick, request.seed, request.fallback_lines)
        return None if result.line == expected else "a fallback line that is not the NPC's fallback line"
    memory = _memory_of_last(request, result, rules, guard)
    if request.output is None or not request.output.structured:  # a structured line is judged from its raw reply
        verdict = judge_reply(result.line, memory, rules, guard)
        if verdict.problem is not None:
            return verdict.problem
        if verdict.line != result.line:
            return f"a line that output handling would change ({len(result.line)} characters)"
    elif raw is None:
        return "a structured reply's line without its raw reply"
    if raw is not None and judge_reply(raw, memory, rules, guard).line != result.line:
        return "a raw response that does not clean to the line"
    if result.attempts and (result.attempts[-1].raw_response != raw or result.attempts[-1].problem is not None):
        return "a last attempt that is not the reply"
    return None


def _retry_memory(
    request: InferenceRequest, result: InferenceResult, rules: Rules, guard: FactGuard | None
) -> WorkingMemory | None:
    """The retry's working memory serving would build after the first attempt was rejected,
    if any; under `tokenizer = "server"` with the counts the result says it was cut with
    (None when they lack a text it needs)."""
    first = result.attempts[0]
    if request.state is None or request.config is None or first.raw_response is None:
        return None
    prohibition = judge_reply(first.raw_response, request.memory, rules, guard).prohibition
    if prohibition is None:
        return None
    config = request.config
    try:
        return build_working_memory(request.state, request.memory.player_input, config, prohibition=prohibition,
                                    counts=result.counts if counted_by_server(config) else None)
    except (OverBudgetError, CountsMissing):
        return None


def _memory_of_last(
    request: InferenceRequest, result: InferenceResult, rules: Rules, guard: FactGuard | None
) -> WorkingMemory:
    if len(result.attempts) == 2:
        retry = _retry_memory(request, result, rules, guard)
        if retry is not None:
            return retry
    return request.memory


def _attempts_problem(
    request: InferenceRequest, result: InferenceResult, rules: Rules, guard: FactGuard | None
) -> str | None:
    attempts = result.attempts
    if len(attempts) > 2:
        return f"{len(attempts)} attempts (serving makes at most 2)"
    memories: list[WorkingMemory | None] = [request.memory]
    if len(attempts) == 2:
        memories.append(_retry_memory(request, result, rules, guard))
    for n, (attempt, memory) in enumerate(zip(attempts, memories[: len(attempts)], strict=True), 1):
        if memory is None:
            return f"attempt {n}: a retry that serving would not have made"
        if attempt.form not in PROMPT_FORMS or attempt.prefix not in PROMPT_PREFIXES:
            return f"attempt {n}: a prompt form or prefix that no backend uses"
        sent = attempt.prefix + memory.sent_text(attempt.form)
        if attempt.prompt != sent or attempt.prohibition != memory.prohibition:
            return f"attempt {n}: a prompt that is not the request's working memory"
        if attempt.raw_response is not None:
            if len(attempt.raw_response) > MAX_RAW_REPLY_CHARS:
                return f"attempt {n}: raw response of {len(attempt.raw_response)} characters"
            verdict = judge_reply(attempt.raw_response, memory, rules, guard)
            if verdict.problem != attempt.problem or verdict.proposals != attempt.proposals:
                return f"attempt {n}: a verdict that output handling does not give"
        elif attempt.problem is None or len(attempt.problem) > _MAX_PROBLEM_CHARS or attempt.proposals:
            return f"attempt {n}: no raw response, and no (or an oversized) reason"
    return None
