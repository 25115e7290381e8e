"""`npcsim loadtest`: many agents building working memories at once, every snapshot checked.

Exit code 0 when no snapshot broke an invariant, 1 otherwise (the first violations are
printed with their agent), 2 for a bad option.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path

import msgspec
from rich.console import Console
from rich.live import Live

from sim.cli._backend import add_backend_arguments, backend_options
from sim.errors import ConfigError
from sim.loadtest import LoadTestConfig, LoadTestResult, Progress, default_processes, run_loadtest
from sim.loadtest._display import print_result, progress_view
from sim.loadtest._plot import require_matplotlib, write_plot
from sim.loadtest._run import Builder
from sim.memory import WorkingMemoryConfig, build_working_memory
from sim.mqtt import BrokerAddress

__all__ = ["loadtest_command", "register"]

_json = msgspec.json.Encoder()


def _whole(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of milliseconds >= 0, got {text!r}")
    return value


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
    p.add_argument("--agents", type=_whole(1), default=1000, metavar="N", help="number of agents (default 1000)")
    until = p.add_mutually_exclusive_group()
    until.add_argument("--duration", type=_positive_seconds, metavar="S", help="run for S seconds (default 10)")
    until.add_argument("--requests", type=_whole(1), metavar="R",
                       help="stop after R round trips (with --concurrency 0: R snapshots)")
    p.add_argument("--concurrency", type=_whole(0), default=64, metavar="C",
                   help="round-trip requests in flight (default 64; 0: build-and-check sweep only)")
    p.add_argument("--processes", type=_whole(0), default=None, metavar="P",
                   help="build-and-check sweep processes (default: one per core; 0: round trip only)")
    p.add_argument("--max-context-chars", type=_whole(1), default=2000, metavar="X",
                   help="the working memory's hard limit in characters (default 2000)")
    p.add_argument("--max-context-tokens", type=_whole(1), default=None, metavar="T",
                   help="also limit each prompt to T tokens (cl100k; extra 'tokens')")
    add_backend_arguments(p, delay=False)
    p.add_argument("--latency-ms", type=_milliseconds, default=0.0, metavar="MS",
                   help="fixed delay of the scripted backend (default 0)")
    p.add_argument("--broker", type=_broker, default=None, metavar="URL",
                   help="send inferences end to end over this MQTT broker (default: in-process)")
    p.add_argument("--seed", type=_whole(0), default=0, metavar="N", help="seed of the agents and picks (default 0)")
    p.add_argument("--json", type=_output, default=None, metavar="FILE", help="write the figures as JSON")
    p.add_argument("--plot", type=_output, default=None, metavar="FILE",
                   help="write a PNG of throughput and latency over time (extra 'plot')")
    p.set_defaults(func=loadtest_command, builder=build_working_memory)


def config_from_args(args: argparse.Namespace) -> LoadTestConfig:
    """The run's config; a bad combination is refused naming the options."""
    processes = default_processes() if args.processes is None else args.processes
    if args.concurrency == 0 and processes == 0:
        raise ConfigError("--concurrency 0 with --processes 0: nothing would run")
    if args.concurrency == 0 and args.broker is not None:
        raise ConfigError("--broker needs round trips: --concurrency must be >= 1")
    try:
        memory = WorkingMemoryConfig(max_context_chars=args.max_context_chars,
                                     max_context_tokens=args.max_context_tokens)
    except ConfigError as exc:
        raise ConfigError(f"--max-context-tokens: {exc}") from exc
    duration = args.duration if args.duration is not None or args.requests is not None else 10.0
    return LoadTestConfig(
        agents=args.agents, duration_s=duration, requests=args.requests, concurrency=args.concurrency,
        processes=processes, memory=memory, backend=args.backend, backend_options=backend_options(args),
        latency_ms=args.latency_ms, broker=args.broker, seed=args.seed,
    )


def loadtest_command(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.plot is not None:
        require_matplotlib()
    console = Console()
    builder: Builder = args.builder
    with Live(console=console, refresh_per_second=4, transient=True) as live:

        def show(progress: Progress) -> None:
            live.update(progress_view(progress))

        result: LoadTestResult = asyncio.run(run_loadtest(config, builder=builder, on_progress=show))
    print_result(console, result)
    if args.json is not None:
        args.json.write_bytes(_json.encode(result) + b"\n")
        console.print(f"figures written to {args.json}")
    if args.plot is not None:
        write_plot(result, args.plot)
        console.print(f"plot written to {args.plot}")
    if result.violations:
        console.print(f"[bold red]{result.violations} invariant violation(s): priority truncation is broken[/]")
        return 1
    return 0
