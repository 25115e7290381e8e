"""The black-box audit: one record per inference, and byte-exact replay of its context.

A record holds the exact `NpcState` the working memory was built from, the player input
and the config, so `replay` can rebuild the working memory with the same pure function and
compare SHA-256 of the prompt and of the msgpack encoding, byte for byte.

Every attempt of an inference is kept (`attempts`): the exact text the model was given
(for the chat endpoint, the messages' contents in order, joined by a blank line), its raw
reply (None when none came) and why it was rejected (None when accepted). A retry's
working memory is the first one rebuilt with the attempt's prohibition, so `replay`
checks every attempt byte for byte too, and a drift is shown as a diff of the attempt's text
(none for an inference that made no call: the hashes are compared). An attempt keeps the
gates' verdict on each part of its reply (`proposals`), and the record the NPC's `output`
policy they applied and the run's `rules` around it (the line limit, the fact guard):
`replay` with a `GateCheck` (sim.output.gate_difference) judges again under them and
compares. An attempt also keeps what the server
said the call cost (`Usage`: prompt tokens, those of them reused from its cache, tokens
generated, its own milliseconds) and which model answered (`ServedBy`), each field None
where the server said nothing: never guessed.

A record names the `renderer` that made its prompt. This npcsim has one,
`RENDERER_VERSION`: a record made by another is refused in one line when it is rebuilt
(replay, show, explain), never rendered another way.

This module does no I/O; the store writes and reads records (`sim.store`).
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Iterable

import msgspec

from sim.errors import NpcsimError, StoreError
from sim.memory import (
    RENDERER_VERSION,
    NpcState,
    TruncationExplanation,
    TruncationReport,
    WorkingMemory,
    WorkingMemoryConfig,
    build_working_memory,
    explain_truncation,
)
from sim.wire.attempt import Attempt, OutputPolicy, Rules
from sim.wire.trace import TRACE_DROPPED, Recalled, TraceAttempt, TraceMessage, for_trace

__all__ = [
    "Attempt",
    "AuditRecord",
    "GateCheck",
    "ReplayResult",
    "ReplayTally",
    "Response",
    "attempt_prompt",
    "decode_record",
    "encode_record",
    "encoding_sha256",
    "make_record",
    "prompt_sha256",
    "replay",
    "replay_records",
    "trace_of",
]

# A request parameter: a scalar, or a list of them (stop sequences).
Param = str | int | float | bool | None | list[str | int | float | bool | None]


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Everything about one inference: what the model saw, said, and why.

    `timings` are milliseconds by phase (e.g. "build", "queue", "infer"); `params` are the
    request parameters sent to the backend (temperature, max_tokens, seed, ...). `output`
    is the NPC's output policy and `rules` the run's rules its replies were judged under
    (the line limit, the fact guard; their own `output` left None: the policy is `output`).
    `counts` are the server tokenizer's token counts (text -> tokens) its working memories
    (the first, and a retry's) were cut with under `tokenizer = "server"`, empty otherwise:
    they are what rebuilds them with no server. `recalled` are the ids of the state's
    episodes that recall brought back from the NPC's whole history (`[memory.scored] recall`):
    kept significant episodes, and the summaries of its place's talk (`sum:PLACE:FIRST-LAST`).
    """

    id: str
    run_id: str
    agent_id: str
    tick: int
    state: NpcState
    player_input: str
    config: WorkingMemoryConfig
    prompt_sha256: str
    encoding_sha256: str
    report: TruncationReport
    backend: str
    model: str
    renderer: int
    params: dict[str, Param] = {}
    line: str = ""
    fallback: bool = False
    fallback_reason: str | None = None
    timings: dict[str, float] = {}
    attempts: tuple[Attempt, ...] = ()
    output: OutputPolicy | None = None
    rules: Rules = Rules()
    counts: dict[str, int] = {}
    recalled: tuple[str, ...] = ()

    def memory(self, prohibition: str | None = None) -> WorkingMemory:
        """The working memory of this record (or of its retry with `prohibition`), rebuilt;
        a StoreError when another renderer made the record."""
        _check_renderer(self)
        return build_working_memory(self.state, self.player_input, self.config, prohibition=prohibition,
                                    counts=self.counts or None)

    def explanation(
        self, memory: WorkingMemory | None = None, *, most_dropped: int | None = None
    ) -> TruncationExplanation:
        """Every item the record's working memory dropped and why: derived from the snapshot, not stored.

        `memory` is the record's working memory when the caller holds it (the recorder
        does): it is rebuilt otherwise. `most_dropped`: see `explain_truncation`."""
        return explain_truncation(self.state, self.player_input, self.config,
                                  self.memory() if memory is None else memory, most_dropped=most_dropped,
                                  counts=self.counts or None)


class ReplayResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of replaying one record; `difference` says what drifted first."""

    record_id: str
    ok: bool
    prompt_sha256: str
    encoding_sha256: str
    difference: str = ""
    attempts: int = 0  # attempts checked


class ReplayTally(msgspec.Struct, kw_only=True):
    """What replaying a run of records found: counts, and the first record that differs.

    Tallies of consecutive runs `add` up to the tally of the whole, so a replay split
    over processes reports what one process reading every record in order reports.
    """

    records: int = 0
    attempts: int = 0
    differing: int = 0
    first: tuple[str, str, int, ReplayResult] | None = None  # (record id, agent, tick, result)

    def add(self, later: ReplayTally) -> None:
        """Fold in the tally of the records that come after these."""
        self.records += later.records
        self.attempts += later.attempts
        self.differing += later.differing
        if self.first is None:
            self.first = later.first


GateCheck = Callable[["AuditRecord", WorkingMemory], str]
"""Re-runs the gates on a record's attempts, given its working memory: the first verdict that
differs from the recorded one, or "" (sim.output.gate_difference: judging lives above this module)."""


def replay_records(records: Iterable[AuditRecord], gates: GateCheck | None = None) -> ReplayTally:
    """Replay every record, in order (with `gates`, their gates' verdicts too)."""
    tally = ReplayTally()
    for record in records:
        result = replay(record, gates)
        tally.records += 1
        tally.attempts += result.attempts
        if not result.ok:
            tally.differing += 1
            if tally.first is None:
                tally.first = (record.id, record.agent_id, record.tick, result)
    return tally


_ENCODER = msgspec.msgpack.Encoder()
_RECORD_DECODER = msgspec.msgpack.Decoder(AuditRecord)


def prompt_sha256(wm: WorkingMemory) -> str:
    """SHA-256 of the prompt's UTF-8 bytes, hex."""
    return hashlib.sha256(wm.prompt.encode("utf-8")).hexdigest()


def encoding_sha256(wm: WorkingMemory) -> str:
    """SHA-256 of the msgpack encoding of the whole working memory, hex."""
    return hashlib.sha256(_ENCODER.encode(wm)).hexdigest()


class Response(msgspec.Struct, frozen=True, kw_only=True):
    """What came of an inference, as its record keeps it: who answered (`backend`, `model`,
    the request `params`), the line said, whether it was the fallback and why, the timings in
    milliseconds by phase, every attempt, and the server tokenizer's counts its working
    memories were cut with (`tokenizer = "server"`; empty otherwise)."""

    backend: str
    model: str
    params: dict[str, Param] = {}
    line: str = ""
    fallback: bool = False
    fallback_reason: str | None = None
    timings: dict[str, float] = {}
    attempts: tuple[Attempt, ...] = ()
    counts: dict[str, int] = {}


_DEFAULT_RULES = Rules()


def make_record(
    memory: WorkingMemory,
    *,
    id: str,
    run_id: str,
    tick: int,
    state: NpcState,
    config: WorkingMemoryConfig,
    response: Response,
    output: OutputPolicy | None = None,
    rules: Rules = _DEFAULT_RULES,
) -> AuditRecord:
    """The record of inference `id`: its working memory `memory`, built from `state` (for
    `memory.player_input`) with `config`, and what came of it; `output`: the NPC's output
    policy the reply was judged under, `rules` the run's rules around it."""
    return AuditRecord(
        id=id,
        run_id=run_id,
        agent_id=state.agent_id,
        tick=tick,
        state=state,
        player_input=memory.player_input,
        config=config,
        prompt_sha256=prompt_sha256(memory),
        encoding_sha256=encoding_sha256(memory),
        report=memory.report,
        backend=response.backend,
        model=response.model,
        renderer=memory.renderer,
        params=response.params,
        line=response.line,
        fallback=response.fallback,
        fallback_reason=response.fallback_reason,
        timings=response.timings,
        attempts=response.attempts,
        output=output,
        rules=rules,
        counts=response.counts,
    )


def _check_renderer(record: AuditRecord) -> None:
    if record.renderer != RENDERER_VERSION:
        raise StoreError(
            f"audit record {record.id!r} was rendered by renderer {record.renderer}, by an earlier npcsim; this one "
            f"has renderer {RENDERER_VERSION} only, so it cannot rebuild it: replay it with the npcsim that wrote it"
        )


def encode_record(record: AuditRecord) -> bytes:
    return _ENCODER.encode(record)


def decode_record(data: bytes, *, where: str = "audit record") -> AuditRecord:
    """Decode a stored record; a corrupt or foreign blob is a StoreError naming it."""
    try:
        return _RECORD_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(f"{where}: cannot decode the stored record: {exc}") from exc


def replay(record: AuditRecord, gates: GateCheck | None = None) -> ReplayResult:
    """Rebuild the record's working memory and compare it byte for byte; with `gates`, re-run
    the gates on every attempt's reply and compare their verdicts.

    Never raises for a drift: a config that no longer builds (e.g. over budget with
    policy "raise") is a difference too, so one bad record does not stop a replay run. A
    record made by another renderer is not a drift: its StoreError is raised.
    """
    _check_renderer(record)
    try:
        wm = record.memory()
    except (NpcsimError, ValueError) as exc:
        return ReplayResult(
            record_id=record.id, ok=False, prompt_sha256="", encoding_sha256="", difference=f"build failed: {exc}"
        )
    got_prompt = prompt_sha256(wm)
    got_encoding = encoding_sha256(wm)
    difference = _first_difference(record, wm, got_prompt, got_encoding) or _attempt_difference(record, wm)
    if not difference and gates is not None:
        difference = gates(record, wm)
    return ReplayResult(
        record_id=record.id,
        ok=not difference,
        prompt_sha256=got_prompt,
        encoding_sha256=got_encoding,
        difference=difference,
        attempts=len(record.attempts),
    )


def attempt_prompt(record: AuditRecord, attempt: Attempt, memory: WorkingMemory | None = None) -> str:
    """What the model was given on `attempt`, rebuilt from the record (raises on a bad build).

    `memory` is the record's own working memory when the caller built it already: an
    attempt without a prohibition (the first) was given exactly that one.
    """
    if memory is None or attempt.prohibition is not None:
        memory = record.memory(attempt.prohibition)
    return attempt.prefix + memory.sent_text(attempt.form)


def _attempt_difference(record: AuditRecord, wm: WorkingMemory) -> str:
    """The first attempt whose rebuilt text differs from the recorded one, as a diff."""
    for n, attempt in enumerate(record.attempts, 1):
        try:
            rebuilt = attempt_prompt(record, attempt, wm)
        except (NpcsimError, ValueError) as exc:
            return f"attempt {n}: build failed: {exc}"
        if rebuilt != attempt.prompt:
            diff = difflib.unified_diff(
                attempt.prompt.splitlines(keepends=True),
                rebuilt.splitlines(keepends=True),
                fromfile=f"recorded prompt of attempt {n}",
                tofile=f"rebuilt prompt of attempt {n}",
            )
            return f"prompt_sha256: attempt {n} differs\n" + "".join(diff)
    return ""


def _first_difference(record: AuditRecord, wm: WorkingMemory, got_prompt: str, got_encoding: str) -> str:
    if got_prompt != record.prompt_sha256:
        head = f"prompt_sha256: recorded {record.prompt_sha256}, rebuilt {got_prompt}\n"
        return head + _attempt_difference(record, wm)  # the diff of what the model was given
    if got_encoding != record.encoding_sha256:
        field = _first_report_field(record.report, wm.report)
        where = f" (first differing field: {field})" if field else ""
        return f"encoding_sha256: recorded {record.encoding_sha256}, rebuilt {got_encoding}{where}"
    field = _first_report_field(record.report, wm.report)
    if field:
        return f"report: {field}"
    return ""


def _first_report_field(recorded: TruncationReport, rebuilt: TruncationReport) -> str:
    """The first field, as a dotted path, where two reports differ; "" when equal."""
    if recorded == rebuilt:
        return ""
    a = msgspec.to_builtins(recorded)
    b = msgspec.to_builtins(rebuilt)
    for key in sorted(a.keys() | b.keys()):
        if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            for sub in sorted(a[key].keys() | b[key].keys()):
                if a[key].get(sub) != b[key].get(sub):
                    return f"report.{key}.{sub}: recorded {a[key].get(sub)!r}, rebuilt {b[key].get(sub)!r}"
        elif a.get(key) != b.get(key):
            return f"report.{key}: recorded {a.get(key)!r}, rebuilt {b.get(key)!r}"
    return ""


def trace_of(
    record: AuditRecord, *, shard: str, location: str | None, prompts: bool = True, memory: WorkingMemory | None = None
) -> TraceMessage:
    """The trace of an inference from its audit record (sim.wire.trace): all but the state snapshot.

    `memory`: the record's working memory, when the caller holds it (not built again)."""
    memory = record.memory() if memory is None else memory
    return TraceMessage(
        run=record.run_id,
        shard=shard,
        agent=record.agent_id,
        location=location,
        tick=record.tick,
        inference_id=record.id,
        player_input=record.player_input,
        line=record.line,
        fallback=record.fallback,
        fallback_reason=record.fallback_reason,
        backend=record.backend,
        model=record.model,
        prompt_sha256=record.prompt_sha256,
        report=record.report,
        latency_ms=record.timings.get("total_ms"),
        prompt=memory.prompt if prompts else None,
        attempts=tuple(
            TraceAttempt(prompt_chars=len(a.prompt), raw_response=a.raw_response, problem=a.problem,
                         prohibition=a.prohibition, usage=a.usage, proposals=a.proposals)
            for a in record.attempts
        ),
        explanation=for_trace(record.explanation(memory, most_dropped=TRACE_DROPPED if prompts else 0),
                              texts=prompts),
        recalled=tuple(Recalled(e.id, e.text if prompts else "") for e in record.state.episodic
                       if e.id in record.recalled) if record.recalled else (),
    )
