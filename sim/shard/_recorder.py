"""The recorder: what the engine keeps of every line an NPC says.

An agent's `speak` (sim.shard._context) hands it one `Spoken`, and the recorder does the
rest, in this order: the over-budget count (docs/working-memory.md: counted, and logged
once per NPC), the run's counters (inferences, fallbacks, lines, the prompt tokens the
model server evaluated and reused, how much of each prompt is a prefix of the NPC's previous
one and what `stable_prefix` gave up; the dialogue when kept), the audit record in the store
(enough to rebuild the exact context the model saw), the metrics, and the trace for viewers.
Every verdict of the gates but "ok", in every attempt (a refusal, or a reply repaired to
its `say`), is counted by its code (`RunStats.verdicts`) and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgspec

from sim.audit import Response, make_record, trace_of
from sim.bus import Bus
from sim.inference import InferenceResult
from sim.memory import NpcState, WorkingMemory, WorkingMemoryConfig
from sim.metrics import MetricsSink
from sim.output import OutputPolicy, Rules
from sim.shard._prefix import PrefixSketches
from sim.shard._stats import RecordCounts
from sim.store import Store
from sim.wire.events import SayMessage

__all__ = ["Recorder", "Spoken"]

log = logging.getLogger(__name__)

_SERVERS_NAMED = 64  # servers counted by name; a remote worker's replies could name any number


class Spoken(msgspec.Struct, frozen=True, kw_only=True):
    """One line said: the `say` message published, and how it came about.

    `state` is the state the working memory was built from, `config` the config it was built with,
    `output` the NPC's output policy the reply was judged under, `rules` the pool's rules
    around it (the line limit, the fact guard), kept in the audit record for replaying them;
    `counts` the server tokenizer's counts the memory was cut with (`tokenizer = "server"`;
    empty otherwise); `recalled` the ids of the state's episodes its recall brought back.
    """

    say: SayMessage
    state: NpcState
    config: WorkingMemoryConfig
    memory: WorkingMemory
    result: InferenceResult
    output: OutputPolicy | None = None
    rules: Rules = Rules()
    counts: dict[str, int] = {}
    recalled: tuple[str, ...] = ()


class Recorder:
    """Audit, trace, metrics and counters of one shard's inferences."""

    def __init__(
        self,
        *,
        run_id: str,
        shard: str,
        store: Store,
        bus: Bus,
        metrics: MetricsSink,
        npc_location: Mapping[str, str],
        keep_dialogue: bool,
        trace_prompts: bool,
    ) -> None:
        self._run_id = run_id
        self._shard = shard
        self._store = store
        self._bus = bus
        self.counts = RecordCounts()
        self._metrics = metrics
        self._npc_location = npc_location
        self._keep_dialogue = keep_dialogue
        self._trace_prompts = trace_prompts
        self._over_budget_logged: set[str] = set()
        self._previous = PrefixSketches()  # each NPC's last prompt, sketched in a fixed size

    async def record(self, spoken: Spoken) -> None:
        say, result = spoken.say, spoken.result
        self._count_over_budget(say.agent, spoken.memory)
        self.counts.inferences += 1
        self.counts.fallbacks += result.fallback
        self.counts.lines += 1
        self._count_calls(result)
        self._count_reuse(say.agent, spoken.memory)
        if self._keep_dialogue:
            self.counts.dialogue.append(say)
        self._count_verdicts(say.agent, result)
        response = Response(backend=result.backend, model=result.model, params=result.params, line=result.line,
                            fallback=result.fallback, fallback_reason=result.fallback_reason,
                            timings=result.timings, attempts=result.attempts,
                            counts={**spoken.counts, **result.counts} if result.counts else spoken.counts)
        record = make_record(spoken.memory, id=say.inference_id, run_id=self._run_id, tick=say.tick,
                             state=spoken.state, config=spoken.config, response=response, output=spoken.output,
                             rules=spoken.rules)
        if spoken.recalled:
            record = msgspec.structs.replace(record, recalled=spoken.recalled)
        await self._store.record(record)
        self._metrics.inference(record.report, result.timings.get("total_ms", 0.0) / 1000)
        trace = trace_of(record, shard=self._shard, location=self._npc_location.get(record.agent_id),
                         prompts=self._trace_prompts, memory=spoken.memory)
        await self._bus.publish_trace(trace)

    def _count_verdicts(self, agent: str, result: InferenceResult) -> None:
        for n, attempt in enumerate(result.attempts, 1):
            for verdict in attempt.proposals:
                if verdict.code != "ok":
                    self.counts.verdicts[verdict.code] = self.counts.verdicts.get(verdict.code, 0) + 1
                    log.info("%s: attempt %d of %s: %s %r %s (%s): %s", agent, n, result.id, verdict.kind,
                             verdict.text[:80], verdict.verdict, verdict.code, verdict.detail)

    def _count_calls(self, result: InferenceResult) -> None:
        """The prompt tokens each call's server evaluated and reused, where it said both; and
        the calls each server answered, where the backend named it."""
        for attempt in result.attempts:
            server = attempt.served_by.server if attempt.served_by is not None else None
            if server is not None:
                named = self.counts.answered_by
                key = server if server in named or len(named) < _SERVERS_NAMED else "(other servers)"
                named[key] = named.get(key, 0) + 1
            usage = attempt.usage
            if usage is not None and usage.evaluated_tokens is not None:
                self.counts.prompt_tokens_evaluated += usage.evaluated_tokens
                self.counts.prompt_tokens_cached += usage.cached_tokens or 0

    def _count_reuse(self, agent: str, memory: WorkingMemory) -> None:
        """How much of the prompt (the first attempt's) is a prefix of the NPC's previous one,
        in characters (sim.shard._prefix); and what `stable_prefix` cost."""
        shared = self._previous.reuse(agent, memory.prompt)
        if shared is not None:
            self.counts.prefix_reuse_pairs += 1
            self.counts.prefix_reuse_share += shared / len(memory.prompt) if memory.prompt else 0.0
        self.counts.stable_cost_chars += memory.report.stable_cost_chars

    def _count_over_budget(self, agent: str, memory: WorkingMemory) -> None:
        if not memory.report.over_budget:
            return
        self.counts.over_budget += 1
        if agent not in self._over_budget_logged:
            self._over_budget_logged.add(agent)
            report = memory.report
            log.warning(
                "%s: the mandatory content alone (%d chars) exceeds max_context_chars=%d; the prompt is over "
                "budget (counted in the summary; not logged again for this NPC)",
                agent, report.mandatory_chars, report.limit_chars,
            )
