"""`npcsim replay`: execute a recorded run again and compare it with the original, or fork it.

    npcsim replay --db run.db                          # identical: N records, M NPCs, T ticks (exit 0)
    npcsim replay --db s0.db --db s1.db --db s2.db     # a sharded run: every shard's store
    npcsim replay --db run.db --fork-at 40 --backend scripted --set 'inference.backend_options.script=["Aye."]' \
        --out fork.db
    npcsim replay --db run.db --set memory.max_context_chars=700,1000   # what-if, recorded replies (sim.cli._whatif)
    npcsim replay --db run.db --fork-at 40 --backend scripted --set memory.max_context_chars=700

The stores are only read. Re-execution writes a new store (`--out`, else a temporary file,
removed at the end); a divergence is exit 1 naming its tick, NPC and what differs. What
the run's stores lack, or a bad option, is one line and exit 2. Progress goes to stderr
about once a second. See docs/replay.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sim.cli import _whatif
from sim.cli._options import BACKEND_OPTIONS, add_backend_arguments, backend_options, whole
from sim.cli._terminal import printable
from sim.errors import ConfigError
from sim.replay import (
    ForkReport,
    RunFigures,
    Variant,
    compare,
    execute,
    fork_report,
    load_recording,
    parse_overrides,
    records_of,
)
from sim.settings import parse_settings

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replay", help="execute a recorded run again from its stores and compare, or fork it at a tick",
        description="Execute a recorded run again in this process, from tick 0, every inference answered with "
        "its recorded replies and every outside input and world-state change fed at its tick, into a new "
        "store; then compare every audit record and every NPC's final state with the original. With "
        "--fork-at T, go on live from tick T with --backend and report how the two runs differ.",
    )
    parser.add_argument("--db", action="append", required=True, metavar="FILE",
                        help="a store of the run (once per shard for a sharded run); only read")
    parser.add_argument("--out", metavar="FILE", help="the new store (default: a temporary file, removed after)")
    parser.add_argument("--until-tick", type=whole(1), metavar="T", help="stop before tick T (default: the run's end)")
    parser.add_argument("--fork-at", type=whole(0), metavar="T",
                        help="recorded replies before tick T, then live with --backend")
    add_backend_arguments(parser)
    _whatif.add_arguments(parser)
    parser.set_defaults(func=replay_command, backend=None)


def replay_command(args: argparse.Namespace) -> int:
    serving = [text for text in args.set if text.startswith(BACKEND_OPTIONS)]
    args.set = [text for text in args.set if not text.startswith(BACKEND_OPTIONS)]
    if serving and args.fork_at is None:
        raise ConfigError(f"--set {serving[0]}: a backend's options are for a fork: give --fork-at T")
    if args.set and args.fork_at is None:  # the what-if: the stores' snapshots, nothing executed
        if args.out is not None or args.until_tick is not None:
            raise ConfigError("--set without --fork-at is a what-if over the recorded snapshots: it executes "
                              "nothing, so --out and --until-tick do not apply")
        return _whatif.run(args)
    if args.examples or args.json is not None or args.plot is not None:
        raise ConfigError("--examples, --json and --plot report a what-if: give --set KEY=VALUE")
    if args.fork_at is None and args.backend is not None:
        raise ConfigError("--backend is for a fork: give --fork-at T (a re-execution answers with the replies "
                          "recorded)")
    if args.fork_at is not None and args.backend is None:
        raise ConfigError(f"--fork-at {args.fork_at}: give the --backend the fork goes on with")
    options: dict[str, Any] = backend_options(args, parse_settings(serving)) if args.backend else {}
    variant = _fork_variant(args.set) if args.set else None
    recording = load_recording(args.db)
    with _out_file(args.out) as out:
        executed = asyncio.run(execute(recording, out, until_tick=args.until_tick, fork_at=args.fork_at,
                                       backend=args.backend or "scripted", backend_options=options,
                                       fork_memory=variant.config if variant is not None else None,
                                       progress=_progress))
        _progress_done()
        if args.fork_at is not None:
            report = fork_report(recording.records, records_of([out], executed.end), args.fork_at)
            _print_fork(report, executed.end)
            if args.out:
                print(f"fork recorded in {printable(str(out))}")
            return 1 if report.before is not None else 0
        comparison = compare(recording, executed)
    if comparison.divergence is not None:
        print(f"divergence: {printable(comparison.divergence.describe())}")
        return 1
    ticks = executed.end
    npcs = f", {comparison.npcs} NPCs" if executed.end == recording.last_tick + 1 else " (final states not compared)"
    print(f"identical: {comparison.records} records{npcs}, {ticks} ticks")
    return 0


def _fork_variant(texts: list[str]) -> Variant:
    """A fork goes on with one working-memory setting: a sweep, or an output policy's rule, is refused."""
    variants = parse_overrides(texts)
    if len(variants) != 1:
        raise ConfigError(f"--set with --fork-at: a fork goes on with one setting, not {len(variants)}; "
                          "give one value per key")
    if variants[0].sets_policy:
        raise ConfigError(f"--set {variants[0].label}: a fork changes working-memory settings only; "
                          "the gates' rules are a what-if's (--set without --fork-at)")
    return variants[0]


@contextlib.contextmanager
def _out_file(given: str | None) -> Iterator[Path]:
    if given is not None:
        yield Path(given)
        return
    with tempfile.TemporaryDirectory(prefix="npcsim-replay-") as where:
        yield Path(where) / "replay.db"


def _progress(tick: int, end: int) -> None:
    ending = "\r" if sys.stderr.isatty() else "\n"
    print(f"replay: tick {tick + 1}/{end}", end=ending, file=sys.stderr, flush=True)


def _progress_done() -> None:
    if sys.stderr.isatty():
        print(file=sys.stderr)


def _print_fork(report: ForkReport, end: int) -> None:
    t = report.fork_at
    if report.before is not None:
        print(f"before tick {t} the fork is not the original: {printable(report.before.describe())}")
    else:
        print(f"ticks 0-{t - 1}: identical to the original ({report.identical_before} records)")
    if report.first is None:
        print(f"ticks {t}-{end - 1}: every line as in the original")
    else:
        print(f"first divergence: {printable(report.first.describe())}")
        print(f"ticks {t}-{end - 1}: {report.lines_differing} of {report.original.inferences} lines differ")
    rows: list[tuple[str, str]] = [
        ("inferences", "inferences"), ("fallbacks", "fallbacks"), ("over budget", "over_budget"),
        ("latency mean ms", "latency_ms_mean"), ("latency p95 ms", "latency_ms_p95"),
    ]
    print(f"{'from tick ' + str(t):<18}{'original':>12}{'fork':>12}")
    for label, field in rows:
        print(f"{label:<18}{_shown(report.original, field):>12}{_shown(report.fork, field):>12}")


def _shown(figures: RunFigures, field: str) -> str:
    value = getattr(figures, field)
    return f"{value:.1f}" if isinstance(value, float) else str(value)
