"""`npcsim audit list|show|replay|export|verify`: read the black-box audit of a store file.

Every command opens the file read-only (`sim.store.open_reader`): auditing never changes
what is audited. `show` prints every attempt of an inference (what the model was given,
its raw reply, why it was rejected, each proposal's verdict, what the server said the call
cost) and every item truncation dropped; `replay` rebuilds and checks every attempt and runs
the gates again on its reply (`sim.output.gate_difference`), in worker processes over
record ranges (`--jobs`, every core by default; the output is the same for any number), and,
given a backend (`--backend openai --base-url ...`, `--backend llamacpp`), says which records
another model answered than the one it serves now (a record whose budget was counted with
tokenizer "server" keeps the counts it was cut with, so it is rebuilt with no server);
`export` writes each record with its `attempts` list, its `proposals` (the said reply's
parts: kind, text or name, verdict, code), its `dropped` list (derived from the record's
snapshot: what truncation left out, and why) and its `prefix_reuse` (how much of its first
attempt's prompt is a prefix of the same agent's previous record's, in (tick, id) order
among the records exported; `show` says the same). The one write is `export --rotate`,
which deletes the records it has exported, once the export is on disk (keeping what their
link of the chain needs, sealed). `verify` checks the store against its seals, and
`replay` does first (sim.cli._seals).

What a record holds came from the run (players' words, models' replies): it is printed
through `sim.cli._terminal`, escaped, and in a pipe one record per line with full ids.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gzip
import os
import sys
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import msgspec
from rich.syntax import Syntax

from sim.audit import AuditRecord, ReplayTally, replay, replay_records
from sim.cli._options import add_backend_arguments, backend_options
from sim.cli._seals import register_verify, sealed_chain
from sim.cli._terminal import Out, json_line, printable
from sim.cli._truncation import dropped_json, print_truncation, report_json
from sim.errors import ConfigError, StoreError
from sim.inference.backends import served_now
from sim.memory import PrefixReuse, WorkingMemory, prefix_reuse
from sim.output import gate_difference
from sim.replay import check_jobs, default_jobs, map_spans, plan_spans
from sim.store import delete_audit_records, kept_key, open_reader
from sim.wire.attempt import ServedBy, Usage

__all__ = ["register"]

_LINE_PREVIEW = 60


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("audit", help="inspect and verify the inference audit of a store")
    commands = group.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")

    list_ = commands.add_parser(
        "list", help="one line per recorded inference (attempts, over budget, fallback)",
        description="One line per recorded inference. In a pipe: tab-separated id, agent, tick, backend/model, "
        "tries, over budget, fallback, line, with full ids and lines; --json names the fields.",
    )
    list_.add_argument("--db", required=True, help="store file (opened read-only)")
    list_.add_argument("--agent", default=None, help="only this agent")
    list_.add_argument("--json", action="store_true", help="JSON Lines: one object per record")
    list_.set_defaults(func=list_command)

    show = commands.add_parser("show", help="the exact prompt, the truncation report and the response")
    show.add_argument("--db", required=True, help="store file (opened read-only)")
    show.add_argument("id", help="inference id")
    show.set_defaults(func=show_command)

    rep = commands.add_parser("replay", help="rebuild every working memory and compare byte for byte")
    rep.add_argument("--db", required=True, help="store file (opened read-only)")
    rep.add_argument("--agent", default=None, help="only this agent")
    rep.add_argument("--jobs", type=int, default=default_jobs(), metavar="N",
                     help="worker processes over record ranges (default: every core); the output does not depend on it")
    add_backend_arguments(rep, serving=False)
    rep.set_defaults(func=replay_command)

    export = commands.add_parser("export", help="records as JSON Lines (gzip-compressed when --out ends in .gz)")
    export.add_argument("--db", required=True, help="store file (read-only, unless --rotate)")
    export.add_argument("--agent", default=None, help="only this agent")
    export.add_argument("--from-tick", type=int, default=None, help="only records of this tick or later")
    export.add_argument("--to-tick", type=int, default=None, help="only records of this tick or earlier")
    export.add_argument("--out", default=None, help="output file (default: standard output); *.gz is gzip")
    export.add_argument("--rotate", action="store_true",
                        help="then delete the exported records from the store, once the file is on disk (needs --out)")
    export.set_defaults(func=export_command)
    register_verify(commands)


def _fallback_column(record: AuditRecord) -> str:
    return (record.fallback_reason or "?") if record.fallback else ""


def list_command(args: argparse.Namespace) -> int:
    out = Out()
    rows = []
    count = over = 0
    with open_reader(args.db) as reader:
        for r in reader.audit_records(args.agent):
            count += 1
            over += r.report.over_budget
            if args.json:
                out.json({
                    "id": r.id, "agent": r.agent_id, "tick": r.tick, "backend": r.backend, "model": r.model,
                    "tries": len(r.attempts), "over_budget": r.report.over_budget, "fallback": r.fallback,
                    "fallback_reason": r.fallback_reason, "line": r.line,
                })
                continue
            line = r.line
            if out.terminal and len(line) > _LINE_PREVIEW:
                line = line[: _LINE_PREVIEW - 1] + "…"
            rows.append((
                r.id, r.agent_id, str(r.tick), f"{r.backend}/{r.model}", str(len(r.attempts)),
                "yes" if r.report.over_budget else "", _fallback_column(r), line,
            ))
    caption = f"{count} records, {over} over budget"
    if not args.json:
        out.table(("id", "agent", "tick", "backend", "tries", "over budget", "fallback", "line"), rows,
                  caption=caption, right=("tick", "tries"),
                  whole=("id", "agent", "tick", "backend", "tries", "over budget", "fallback"), stretch="line")
    if not out.terminal:  # the count for the person at the pipe; standard output holds only records
        Out(sys.stderr).record(caption)
    return 0


def _fallback(record: AuditRecord) -> str:
    return f"yes: {record.fallback_reason or 'no reason recorded'}"


def _raw(text: str | None) -> str:
    """A raw reply as shown: none at all and an empty one are told apart."""
    return "(none)" if text is None else text or "(empty)"


def _print_proposals(out: Out, record: AuditRecord) -> None:
    """Each attempt's parts (the line, beliefs, memories, the intent) and the gates' verdicts."""
    rows = [(str(n), p.kind, p.about or "", p.text if p.kind != "intent" else f"{p.text} {json_line(p.args)}",
             p.verdict, p.code, p.detail)
            for n, a in enumerate(record.attempts, 1) for p in a.proposals]
    if not rows:
        return
    if out.terminal:
        out.table(("#", "kind", "about", "text", "verdict", "code", "why"), rows, title="proposals", fold=True)
        return
    for number, kind, about, text, verdict, code, why in rows:
        out.record(f"attempt {number}: {kind}{f' about {about}' if about else ''}: {verdict} ({code}): ", text,
                   f" {why}" if why else "")


def _export_proposals(record: AuditRecord) -> list[dict[str, object]]:
    """The said reply's parts as `audit export` gives them: kind, text (an intent: name), verdict, code."""
    if not record.attempts:
        return []
    return [{"kind": p.kind, "name" if p.kind == "intent" else "text": p.text, "verdict": p.verdict, "code": p.code}
            for p in record.attempts[-1].proposals]


def _usage(usage: Usage | None) -> str:
    """What the server said a call cost; "?" for each figure it did not say."""
    if usage is None:
        return "(no reply)"

    def figure(value: float | None) -> str:
        return "?" if value is None else f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"

    return (f"prompt {figure(usage.prompt_tokens)} tokens ({figure(usage.cached_tokens)} cached), "
            f"completion {figure(usage.completion_tokens)}; prompt {figure(usage.prompt_ms)} ms, "
            f"generation {figure(usage.predicted_ms)} ms")


def _served_by(served_by: ServedBy | None) -> str:
    """Which model answered, as far as the backend said."""
    if served_by is None:
        return "(no reply)"
    said = [f"{name} {value}" for name, value in msgspec.structs.asdict(served_by).items() if value is not None]
    return ", ".join(said) or "(not said)"


def _first_prompt(record: AuditRecord) -> str:
    """What the model was given first: the first attempt's text (the prompt, rebuilt, for a
    record that kept no attempts)."""
    if record.attempts:
        return record.attempts[0].prompt
    return record.memory().prompt


def _reuse_json(reuse: PrefixReuse) -> dict[str, object]:
    return {**msgspec.to_builtins(reuse), "share": round(reuse.share, 4)}


def _reuse_text(reuse: PrefixReuse | None, previous: AuditRecord | None) -> str:
    if reuse is None or previous is None:
        return "(the agent's first record)"
    tokens = "" if reuse.tokens is None else f", {reuse.tokens:,} of {reuse.prompt_tokens:,} tokens"
    return (f"{reuse.chars:,} of {reuse.prompt_chars:,} chars ({100 * reuse.share:.1f}%){tokens}, "
            f"with record {previous.id} (tick {previous.tick})")


def _print_attempts(out: Out, record: AuditRecord) -> None:
    """Every attempt: the exact text given, the raw reply, why it was rejected, what the server said it cost."""
    rows = []
    for n, a in enumerate(record.attempts, 1):
        given = a.prompt if a.prohibition is None else f"[rule: {a.prohibition}]\n{a.prompt}"
        rows.append((str(n), given, _raw(a.raw_response), a.problem or "accepted", _usage(a.usage),
                     _served_by(a.served_by)))
    if out.terminal:
        out.table(("#", "given to the model", "raw response", "problem", "usage", "served by"), rows,
                  title="attempts", fold=True)
        return
    out.record(f"attempts: {len(rows)}")
    for number, given, raw, problem, usage, served_by in rows:  # in a pipe: the prompt as lines, the rest a line each
        out.block(f"attempt {number}: given to the model", given)
        out.record(f"attempt {number}: raw response: ", raw)
        out.record(f"attempt {number}: problem: ", problem)
        out.record(f"attempt {number}: usage: ", usage)
        out.record(f"attempt {number}: served by: ", served_by)


def show_command(args: argparse.Namespace) -> int:
    out = Out()
    with open_reader(args.db) as reader:
        record = reader.audit_record(args.id)
        previous = reader.previous_audit_record(record)
    reuse = None if previous is None else prefix_reuse(_first_prompt(previous), _first_prompt(record), record.config)
    wm = record.memory()
    result = replay(record, gate_difference)
    out.block(f"{record.id}: {record.agent_id} at tick {record.tick} (prompt rebuilt from the recorded state)",
              wm.prompt)
    print_truncation(out, wm.report, record.explanation())
    if record.recalled:
        out.record(_recalled_text(record, wm))
    verdict = ("replay identical", "green") if result.ok else (
        "replay DIFFERS (see `npcsim audit replay`)", "bold red")
    out.record(f"prompt sha256 {record.prompt_sha256}  ", verdict)
    out.table(("field", "value"), [
        ("backend", f"{record.backend} / {record.model}"),
        ("params", json_line(record.params)),
        ("raw response", _raw(record.attempts[-1].raw_response if record.attempts else None)),
        ("line", record.line),
        ("fallback", _fallback(record) if record.fallback else "no"),
        ("timings (ms)", ", ".join(f"{k} {v:.1f}" for k, v in sorted(record.timings.items()))),
        ("renderer", str(record.renderer)),
        ("prefix reuse", _reuse_text(reuse, previous)),
    ], whole=("field",))
    if record.attempts:
        _print_attempts(out, record)
        _print_proposals(out, record)
    else:
        out.record("no attempts recorded (a stale request, or a record written before attempts were kept)")
    return 0


def _recalled_text(record: AuditRecord, wm: WorkingMemory) -> str:
    """The episodes recall brought back, each with its tick and whether the prompt kept it."""
    kept = {e.id for e in wm.episodic}
    ticks = {e.id: e.tick for e in record.state.episodic}
    items = [f"{i} (tick {ticks.get(i, '?')}, {'kept' if i in kept else 'dropped'})" for i in record.recalled]
    return f"recalled from the whole history ({len(items)}): " + ", ".join(items)


def _other_models(args: argparse.Namespace, out: Out, records: int) -> None:
    """With a backend given: the records some other model answered than the one it serves now."""
    if args.backend == "scripted":
        return
    now = asyncio.run(served_now(args.backend, backend_options(args)))
    count, first = 0, None
    with open_reader(args.db) as reader:
        for record in reader.audit_records(args.agent):
            said = next((a.served_by for a in record.attempts if a.served_by and a.served_by.differs(now)), None)
            if said is not None:
                count += 1
                first = first or (record.id, said)
    if first is None:
        out.record(f"every record that names its model was answered by the one {args.backend} serves now "
                   f"({_served_by(now)})")
        return
    out.record((f"{count} of {records} records were answered by another model than the one {args.backend} serves "
                "now", "bold yellow"))
    out.record(f"first: record {first[0]}, served by {_served_by(first[1])}; now: {_served_by(now)}")


def replay_command(args: argparse.Namespace) -> int:
    out = Out()
    check_jobs(args.jobs)
    if not sealed_chain(Path(args.db), out):
        return 1
    tally = ReplayTally()
    replaying: Callable[[Iterable[AuditRecord]], ReplayTally] = functools.partial(replay_records,
                                                                                  gates=gate_difference)
    for part in map_spans(replaying, plan_spans([args.db], args.jobs, agent=args.agent), args.jobs):
        tally.add(part)
    _other_models(args, out, tally.records)
    if tally.first is None:
        out.record(f"replayed {tally.records} records: all byte-identical ({tally.attempts} attempts checked)")
        return 0
    record_id, agent, tick, result = tally.first
    out.record((f"replayed {tally.records} records: {tally.differing} differ", "bold red"))
    out.record(f"first difference: record {record_id} (agent {agent}, tick {tick})")
    if result.difference.startswith("prompt_sha256") and "\n---" in result.difference:
        head, _, diff = result.difference.partition("\n")
        out.record(head)
        if out.terminal:
            out.console.print(Syntax(printable(diff, lines=True), "diff", theme="ansi_dark", word_wrap=True))
        else:
            out.block("diff", diff)
    else:
        out.block("difference", result.difference)
    return 1


def _tick_range(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """`--from-tick` and `--to-tick`: whole ticks >= 0, the first not after the last."""
    for option, value in (("--from-tick", args.from_tick), ("--to-tick", args.to_tick)):
        if value is not None and value < 0:
            raise ConfigError(f"{option} must be >= 0, got {value}")
    if args.from_tick is not None and args.to_tick is not None and args.from_tick > args.to_tick:
        raise ConfigError(f"--from-tick {args.from_tick} is after --to-tick {args.to_tick}")
    return args.from_tick, args.to_tick


def export_command(args: argparse.Namespace) -> int:
    from_tick, to_tick = _tick_range(args)
    if args.rotate and args.out is None:
        raise ConfigError("--rotate needs --out: records are deleted only once they are in a file")
    exported: list[str] = []
    encoder = msgspec.json.Encoder()
    with ExitStack() as stack:
        reader = stack.enter_context(open_reader(args.db))
        out: BinaryIO | gzip.GzipFile
        if args.out is None:
            out = sys.stdout.buffer
        else:
            try:
                out = stack.enter_context(Path(args.out).open("wb"))
            except OSError as exc:
                raise StoreError(f"{args.out}: cannot write the export: {exc}") from exc
            if args.out.endswith(".gz"):
                out = stack.enter_context(gzip.GzipFile(fileobj=out, mode="wb"))
        count = 0
        previous: dict[str, str] = {}  # each agent's last first prompt: one per agent exported
        # A closed pipe (`| head`) raises BrokenPipeError here: sim.cli.main ends quietly.
        for record in reader.audit_records(args.agent, from_tick=from_tick, to_tick=to_tick):
            row = msgspec.to_builtins(record)
            row["proposals"] = _export_proposals(record)
            row["report"] = report_json(record.report)
            row["dropped"] = dropped_json(record.explanation())
            prompt = _first_prompt(record)
            before = previous.get(record.agent_id)
            row["prefix_reuse"] = None if before is None else _reuse_json(prefix_reuse(before, prompt, record.config))
            previous[record.agent_id] = prompt
            # on standard output (maybe a terminal) the run's text is escaped, as JSON escapes: same data
            out.write((json_line(row).encode() if args.out is None else encoder.encode(row)) + b"\n")
            count += 1
            if args.rotate:
                exported.append(record.id)
        out.flush()
    note = Out(sys.stderr)
    if args.out is not None:
        note.record(f"exported {count} records to {args.out}")
    if args.rotate:
        _sync(Path(args.out))
        deleted = delete_audit_records(args.db, exported, kept_key(Path(args.db)))
        note.record(f"rotated: deleted {deleted} exported records from {args.db}")
    return 0


def _sync(path: Path) -> None:
    """The export is on disk before anything is deleted."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreError(f"{path}: cannot sync the export to disk, nothing deleted: {exc}") from exc
