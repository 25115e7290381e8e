"""`npcsim audit list|show|replay|export`: read the black-box audit of a store file.

Every command opens the file read-only (`sim.store.open_reader`): auditing never changes
what is audited. `show` prints every attempt of an inference (what the model was given,
its raw reply, why it was rejected) and every item truncation dropped; `replay` rebuilds and
checks every attempt; `export` writes each record with its `attempts` list and its `dropped`
list (derived from the record's snapshot: what truncation left out, and why). The one write is `export --rotate`, which
deletes the records it has exported, once the export is on disk.
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
from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from sim.audit import AuditRecord, replay
from sim.cli._truncation import dropped_json, dropped_table, report_table
from sim.errors import ConfigError, StoreError
from sim.store import delete_audit_records, open_reader

__all__ = ["register"]

_LINE_PREVIEW = 60


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("audit", help="inspect and verify the inference audit of a store")
    commands = group.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")

    list_ = commands.add_parser("list", help="one line per recorded inference (attempts, over budget, fallback)")
    list_.add_argument("--db", required=True, help="store file (opened read-only)")
    list_.add_argument("--agent", default=None, help="only this agent")
    list_.set_defaults(func=list_command)

    show = commands.add_parser("show", help="the exact prompt, the truncation report and the response")
    show.add_argument("--db", required=True, help="store file (opened read-only)")
    show.add_argument("id", help="inference id")
    show.set_defaults(func=show_command)

    rep = commands.add_parser("replay", help="rebuild every working memory and compare byte for byte")
    rep.add_argument("--db", required=True, help="store file (opened read-only)")
    rep.add_argument("--agent", default=None, help="only this agent")
    rep.set_defaults(func=replay_command)

    export = commands.add_parser("export", help="records as JSON Lines (gzip-compressed when --out ends in .gz)")
    export.add_argument("--db", required=True, help="store file (opened read-only)")
    export.add_argument("--agent", default=None, help="only this agent")
    export.add_argument("--from-tick", type=int, default=None, help="only records of this tick or later")
    export.add_argument("--to-tick", type=int, default=None, help="only records of this tick or earlier")
    export.add_argument("--out", default=None, help="output file (default: standard output); *.gz is gzip")
    export.add_argument("--rotate", action="store_true",
                        help="then delete the exported records from the store (needs --out)")
    export.set_defaults(func=export_command)


def list_command(args: argparse.Namespace) -> int:
    console = Console()
    table = Table(show_edge=False)
    rows = []
    count = over = 0
    with open_reader(args.db) as reader:
        for r in reader.audit_records(args.agent):
            count += 1
            over += r.report.over_budget
            line = r.line if len(r.line) <= _LINE_PREVIEW else r.line[: _LINE_PREVIEW - 1] + "…"
            rows.append((
                r.id, r.agent_id, str(r.tick), f"{r.backend}/{r.model}", str(len(r.attempts)),
                "yes" if r.report.over_budget else "", r.fallback_reason or "?" if r.fallback else "", Text(line),
            ))
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(3)]
    for column, width in zip(("id", "agent", "tick"), widths, strict=True):
        table.add_column(column, no_wrap=True, min_width=width, justify="right" if column == "tick" else "left")
    for column in ("backend", "tries", "over budget", "fallback"):
        table.add_column(column, justify="right" if column == "tries" else "left")
    table.add_column("line", ratio=1)
    for row in rows:
        table.add_row(*row)
    table.caption = f"{count} records, {over} over budget"
    console.print(table)
    return 0


def _fallback(record: AuditRecord) -> str:
    return f"yes: {record.fallback_reason or 'no reason recorded'}"


def _raw(text: str | None) -> str:
    """A raw reply as shown: none at all and an empty one are told apart."""
    return "(none)" if text is None else text or "(empty)"


def _attempts_table(record: AuditRecord) -> Table:
    """Every attempt: the exact text given, the raw reply, and why it was rejected."""
    table = Table(title="attempts", title_justify="left", show_lines=True)
    for column in ("#", "given to the model", "raw response", "problem"):
        table.add_column(column, overflow="fold")
    for n, a in enumerate(record.attempts, 1):
        given = a.prompt if a.prohibition is None else f"[rule: {a.prohibition}]\n{a.prompt}"
        table.add_row(
            str(n), Text(given), Text(_raw(a.raw_response)),
            Text(a.problem or "accepted"),
        )
    return table


def show_command(args: argparse.Namespace) -> int:
    console = Console()
    with open_reader(args.db) as reader:
        record = reader.audit_record(args.id)
    wm = record.memory()
    result = replay(record)
    prompt = record.prompt if record.prompt is not None else wm.prompt
    source = "recorded" if record.prompt is not None else "rebuilt from the recorded state"
    console.print(
        Panel(
            Text(prompt),
            title=f"{record.id}: {record.agent_id} at tick {record.tick} (prompt {source})",
            expand=False,
        )
    )
    explanation = record.explanation()
    console.print(report_table(wm.report, explanation))
    console.print(dropped_table(explanation))
    verdict = "[green]replay identical[/]" if result.ok else "[bold red]replay DIFFERS[/] (see `npcsim audit replay`)"
    console.print(f"prompt sha256 {record.prompt_sha256}  {verdict}")
    response = Table(show_header=False, show_edge=False)
    response.add_column("field")
    response.add_column("value")
    response.add_row("backend", f"{record.backend} / {record.model}")
    response.add_row("params", Text(msgspec.json.encode(record.params).decode()))
    response.add_row("raw response", Text(_raw(record.raw_response)))
    response.add_row("line", Text(record.line))
    response.add_row("fallback", Text(_fallback(record) if record.fallback else "no"))
    response.add_row("timings (ms)", ", ".join(f"{k} {v:.1f}" for k, v in sorted(record.timings.items())))
    response.add_row("renderer", str(record.renderer))
    console.print(response)
    if record.attempts:
        console.print(_attempts_table(record))
    else:
        console.print("no attempts recorded (a stale request, or a record written before attempts were kept)")
    return 0


def replay_command(args: argparse.Namespace) -> int:
    console = Console()
    total = 0
    attempts = 0
    differing = 0
    first = None
    with open_reader(args.db) as reader:
        for record in reader.audit_records(args.agent):
            total += 1
            result = replay(record)
            attempts += result.attempts
            if not result.ok:
                differing += 1
                if first is None:
                    first = (record, result)
    if first is None:
        console.print(f"replayed {total} records: all byte-identical ({attempts} attempts checked)")
        return 0
    record, result = first
    console.print(f"[bold red]replayed {total} records: {differing} differ[/]")
    console.print(f"first difference: record {record.id} (agent {record.agent_id}, tick {record.tick})")
    if result.difference.startswith("prompt_sha256") and "\n---" in result.difference:
        head, _, diff = result.difference.partition("\n")
        console.print(head)
        console.print(Syntax(diff, "diff", theme="ansi_dark", word_wrap=True))
    else:
        console.print(Text(result.difference))
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
        try:
            for record in reader.audit_records(args.agent, from_tick=args.from_tick, to_tick=args.to_tick):
                row = msgspec.to_builtins(record)
                row["dropped"] = dropped_json(record.explanation())
                out.write(encoder.encode(row) + b"\n")
                count += 1
                if args.rotate:
                    exported.append(record.id)
            out.flush()
        except BrokenPipeError:
            # the reader went away (`| head`): stop quietly, and keep Python's exit flush quiet too
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 1
    if args.out is not None:
        Console(stderr=True).print(f"exported {count} records to {args.out}")
    if args.rotate:
        _sync(Path(args.out))
        deleted = delete_audit_records(args.db, exported)
        Console(stderr=True).print(f"rotated: deleted {deleted} exported records from {args.db}")
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
