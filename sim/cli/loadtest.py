"""`npcsim loadtest`: many agents building working memories at once, every snapshot checked.

Exit code 0 when no snapshot broke an invariant and (with `--output structured`) no accepted
proposal broke a rule, 1 otherwise (the first violations are printed with their agent), 2
for a bad option.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
from rich.live import Live

from sim.cli._observe import add_metrics_argument, metrics_served
from sim.cli._options import (
    BACKEND_OPTIONS,
    add_backend_arguments,
    add_set_argument,
    backend_options,
    milliseconds,
    seconds,
    settings_of,
    whole,
)
from sim.cli._terminal import Out
from sim.errors import ConfigError
from sim.loadtest import (
    OUTPUTS,
    Builder,
    LoadTestConfig,
    LoadTestResult,
    Progress,
    default_processes,
    progress_view,
    require_matplotlib,
    result_sections,
    run_loadtest,
    write_plot,
)
from sim.memory import WorkingMemoryConfig, build_working_memory
from sim.mqtt import BrokerAddress
from sim.settings import with_settings

__all__ = ["loadtest_command", "register"]

_json = msgspec.json.Encoder()


def _whole_list(minimum: int) -> Callable[[str], tuple[int, ...]]:
    """A comma-separated list of whole numbers >= minimum, each once: "1000,2000,4000"."""
    one = whole(minimum)

    def parse(text: str) -> tuple[int, ...]:
        values = tuple(one(part.strip()) for part in text.split(","))
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"each value once, got {text!r}")
        return values

    return parse


def _broker(text: str) -> str:
    try:
        BrokerAddress.parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _output(text: str) -> Path:
    path = Path(text)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {str(path.parent)!r} does not exist")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory")
    return path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "loadtest",
        help="load-test priority truncation: many agents, every snapshot checked",
        description="Build working memories for many seeded random agents at once, check every snapshot "
        "against the invariants I1-I6, and send them through the inference pool.",
    )
    p.add_argument("--agents", type=whole(1), default=1000, metavar="N", help="number of agents (default 1000)")
    until = p.add_mutually_exclusive_group()
    until.add_argument("--duration", type=seconds, metavar="S",
                       help="run each phase (budget, concurrency) for S seconds (default 10)")
    until.add_argument("--requests", type=whole(1), metavar="R",
                       help="stop each phase after R round trips (with --concurrency 0: R snapshots)")
    p.add_argument("--concurrency", type=_whole_list(0), default=(64,), metavar="C[,C...]",
                   help="round-trip requests in flight (default 64; 0: build-and-check sweep only); a list "
                   "such as 1,2,4,8,16 measures each in turn: the model-server sweep")
    p.add_argument("--processes", type=whole(0), default=None, metavar="P",
                   help="build-and-check sweep processes (default: one per core; 0: round trip only)")
    p.add_argument("--max-context-chars", type=_whole_list(1), default=(2000,), metavar="X[,X...]",
                   help="the working memory's hard limit in characters (default 2000); a list such as "
                   "1000,2000,4000 runs each budget on the same agents, side by side")
    p.add_argument("--max-context-tokens", type=_whole_list(1), default=None, metavar="T[,T...]",
                   help="also limit each prompt to T tokens (cl100k; extra 'tokens'); a list pairs up with "
                   "--max-context-chars")
    add_backend_arguments(p)
    p.add_argument("--latency-ms", type=milliseconds, default=0.0, metavar="MS",
                   help="fixed delay of the scripted backend (default 0)")
    p.add_argument("--broker", type=_broker, default=None, metavar="URL",
                   help="send inferences end to end over this MQTT broker (default: in-process)")
    p.add_argument("--output", choices=OUTPUTS, default="line",
                   help="what the round trip's agents answer: a line (default), or a structured reply whose "
                   "proposals go through the gates while players attack them, every verdict checked again "
                   "(the scripted backend made gullible)")
    p.add_argument("--seed", type=whole(0), default=0, metavar="N", help="seed of the agents and picks (default 0)")
    p.add_argument("--json", type=_output, default=None, metavar="FILE", help="write the figures as JSON")
    p.add_argument("--plot", type=_output, default=None, metavar="FILE",
                   help="write a PNG of throughput and latency over time (extra 'plot')")
    add_set_argument(p, "memory.KEY (every working memory's, e.g. memory.selection=scored; "
                     "docs/working-memory.md) and inference.backend_options.NAME")
    add_metrics_argument(p)
    p.set_defaults(func=loadtest_command, builder=build_working_memory)


def _budgets(
    chars: tuple[int, ...], tokens: tuple[int, ...] | None, memory: dict[str, str]
) -> tuple[WorkingMemoryConfig, ...]:
    """The budgets to run: the two lists paired up, a single value standing for every budget,
    each with the `--set memory.KEY` settings."""
    token_list: tuple[int | None, ...] = tokens or (None,)
    if len(chars) > 1 and len(token_list) > 1 and len(chars) != len(token_list):
        raise ConfigError(
            f"--max-context-chars has {len(chars)} values and --max-context-tokens {len(token_list)}: "
            "give lists of the same length, or one value for either"
        )
    n = max(len(chars), len(token_list))
    pairs = zip(chars * n if len(chars) == 1 else chars, token_list * n if len(token_list) == 1 else token_list,
                strict=True)
    budgets = []
    for c, t in pairs:
        try:
            budget = WorkingMemoryConfig(max_context_chars=c, max_context_tokens=t)
        except ConfigError as exc:
            raise ConfigError(f"--max-context-tokens: {exc}") from exc
        budgets.append(with_settings(budget, memory, "memory."))
    return tuple(budgets)


def config_from_args(args: argparse.Namespace) -> LoadTestConfig:
    """The run's config; a bad combination is refused naming the options."""
    processes = default_processes() if args.processes is None else args.processes
    levels: tuple[int, ...] = args.concurrency
    if len(levels) > 1 and 0 in levels:
        raise ConfigError(f"--concurrency: 0 (build-and-check only) cannot be part of a list, got {levels}")
    if levels == (0,) and processes == 0:
        raise ConfigError("--concurrency 0 with --processes 0: nothing would run")
    if levels == (0,) and args.broker is not None:
        raise ConfigError("--broker needs round trips: --concurrency must be >= 1")
    if levels == (0,) and args.output == "structured":
        raise ConfigError("--output structured needs round trips: --concurrency must be >= 1")
    settings = settings_of(args.set, ("memory.", BACKEND_OPTIONS), "loadtest")
    memory = {k.removeprefix("memory."): v for k, v in settings.items() if k.startswith("memory.")}
    memories = _budgets(args.max_context_chars, args.max_context_tokens, memory)
    duration = args.duration if args.duration is not None or args.requests is not None else 10.0
    return LoadTestConfig(
        agents=args.agents, duration_s=duration, requests=args.requests,
        concurrency=levels[0] if len(levels) == 1 else levels, processes=processes,
        memory=memories[0] if len(memories) == 1 else memories, backend=args.backend,
        backend_options=backend_options(args, settings), latency_ms=args.latency_ms, broker=args.broker, seed=args.seed,
        output=args.output,
    )


def loadtest_command(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.plot is not None:
        require_matplotlib()
    out = Out()
    builder: Builder = args.builder
    latest: list[Progress] = []
    with metrics_served(args.metrics_port, out) as metrics, _progress_line(out) as show_line:
        if metrics is not None:
            metrics.watch_loadtest(lambda: latest[-1] if latest else None)

        def show(progress: Progress) -> None:
            latest[:] = [progress]
            show_line(progress)

        result: LoadTestResult = asyncio.run(run_loadtest(config, builder=builder, on_progress=show))
    _print_result(out, result)
    if args.json is not None:
        args.json.write_bytes(_json.encode(result) + b"\n")
        out.record(f"figures written to {args.json}")
    if args.plot is not None:
        write_plot(result, args.plot)
        out.record(f"plot written to {args.plot}")
    broken = 0
    if result.violations:
        out.record((f"{result.violations} invariant violation(s): priority truncation is broken", "bold red"))
        broken = 1
    if result.gates is not None and result.gates.violations:
        out.record((f"{result.gates.violations} gate violation(s): an accepted proposal breaks a rule", "bold red"))
        broken = 1
    return broken


@contextlib.contextmanager
def _progress_line(out: Out) -> Iterator[Callable[[Progress], None]]:
    """The live progress line on a terminal (gone when the run ends); nothing in a pipe."""
    if not out.terminal:
        yield lambda _: None
        return
    with Live(console=out.console, refresh_per_second=4, transient=True) as live:
        yield lambda progress: live.update(progress_view(progress))


def _print_result(out: Out, result: LoadTestResult) -> None:
    """The result's tables: drawn on a terminal; in a pipe a header line and one line per row."""
    for n, section in enumerate(result_sections(result)):
        if n:
            out.blank()
        out.table(section.columns, section.rows, title=section.title, caption=section.caption, right=section.right,
                  header=True)
        for note in section.notes:
            out.record((note, "bold"))
