"""`npcsim audit list|show|replay|export`: read the black-box audit of a store file.

Every command opens the file read-only (`sim.store.open_reader`): auditing never changes
what is audited. `show` prints every attempt of an inference (what the model was given,
its raw reply, why it was rejected) and every item truncation dropped; `replay` rebuilds and
checks every attempt, in worker processes over record ranges (`--jobs`, every core by
default; the output is the same for any number); `export` writes each record with its `attempts` list and its `dropped`
list (derived from the record's snapshot: what truncation left out, and why). The one write
is `export --rotate`, which deletes the records it has exported, once the export is on disk.

What a record holds came from the run (players' words, models' replies): it is printed
through `sim.cli._terminal`, escaped, and in a pipe one record per line with full ids.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import msgspec
from rich.syntax import Syntax

from sim.audit import AuditRecord, ReplayTally, replay, replay_records
from sim.cli._terminal import Out, json_line, printable
from sim.cli._truncation import dropped_json, print_truncation, report_json
from sim.errors import ConfigError, StoreError
from sim.replay import check_jobs, default_jobs, map_spans, plan_spans
from sim.store import delete_audit_records, open_reader

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


def _print_attempts(out: Out, record: AuditRecord) -> None:
    """Every attempt: the exact text given, the raw reply, and why it was rejected."""
    rows = []
    for n, a in enumerate(record.attempts, 1):
        given = a.prompt if a.prohibition is None else f"[rule: {a.prohibition}]\n{a.prompt}"
        rows.append((str(n), given, _raw(a.raw_response), a.problem or "accepted"))
    if out.terminal:
        out.table(("#", "given to the model", "raw response", "problem"), rows, title="attempts", fold=True)
        return
    out.record(f"attempts: {len(rows)}")
    for number, given, raw, problem in rows:  # in a pipe: the prompt as its lines, the rest one line each
        out.block(f"attempt {number}: given to the model", given)
        out.record(f"attempt {number}: raw response: ", raw)
        out.record(f"attempt {number}: problem: ", problem)


def show_command(args: argparse.Namespace) -> int:
    out = Out()
    with open_reader(args.db) as reader:
        record = reader.audit_record(args.id)
    wm = record.memory()
    result = replay(record)
    prompt = record.prompt if record.prompt is not None else wm.prompt
    source = "recorded" if record.prompt is not None else "rebuilt from the recorded state"
    out.block(f"{record.id}: {record.agent_id} at tick {record.tick} (prompt {source})", prompt)
    print_truncation(out, wm.report, record.explanation())
    verdict = ("replay identical", "green") if result.ok else (
        "replay DIFFERS (see `npcsim audit replay`)", "bold red")
    out.record(f"prompt sha256 {record.prompt_sha256}  ", verdict)
    out.table(("field", "value"), [
        ("backend", f"{record.backend} / {record.model}"),
        ("params", json_line(record.params)),
        ("raw response", _raw(record.raw_response)),
        ("line", record.line),
        ("fallback", _fallback(record) if record.fallback else "no"),
        ("timings (ms)", ", ".join(f"{k} {v:.1f}" for k, v in sorted(record.timings.items()))),
        ("renderer", str(record.renderer)),
    ], whole=("field",))
    if record.attempts:
        _print_attempts(out, record)
    else:
        out.record("no attempts recorded (a stale request, or a record written before attempts were kept)")
    return 0


def replay_command(args: argparse.Namespace) -> int:
    out = Out()
    check_jobs(args.jobs)
    tally = ReplayTally()
    for part in map_spans(replay_records, plan_spans([args.db], args.jobs, agent=args.agent), args.jobs):
        tally.add(part)
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


def _tick_range(args: argparse.Namespace) -> None:
    for option, value in (("--from-tick", args.from_tick), ("--to-tick", args.to_tick)):
        if value is not None and value < 0:
            raise ConfigError(f"{option} must be >= 0, got {value}")
    if args.from_tick is not None and args.to_tick is not None and args.from_tick > args.to_tick:
        raise ConfigError(f"--from-tick {args.from_tick} is after --to-tick {args.to_tick}")


def export_command(args: argparse.Namespace) -> int:
    _tick_range(args)
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
        # A closed pipe (`| head`) raises BrokenPipeError here: sim.cli.main ends quietly.
        for record in reader.audit_records(args.agent, from_tick=args.from_tick, to_tick=args.to_tick):
            row = msgspec.to_builtins(record)
            row["report"] = report_json(record.report)
            row["dropped"] = dropped_json(record.explanation())
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
        deleted = delete_audit_records(args.db, exported)
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
