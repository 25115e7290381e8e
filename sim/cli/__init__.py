"""The `npcsim` command line: one parser, one small module per command group.

Every command is a function `(args) -> exit code`, so tests call `main([...])` in-process.
Output follows `sim.cli._terminal`: decorated on a terminal, one plain record per line in
a pipe, run data always escaped; a closed pipe (`| head -1`) ends any command quietly with
exit status 0. `--quiet` (of `run`) leaves only errors, in the log too, unless `-v` asks
for more.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from sim import __version__
from sim.cli import audit, contract, loadtest, memory, replay, run, subscribe, view, worker
from sim.cli._terminal import closed_pipe, silence_stdout
from sim.errors import NpcsimError

__all__ = ["build_parser", "console", "main"]

# Each module adds its sub-commands with `register(subparsers)`.
COMMAND_GROUPS = [memory, run, subscribe, worker, audit, loadtest, view, replay, contract]


class _Parser(argparse.ArgumentParser):
    """Reports a bad argument as one line (no usage block), exit code 2; sub-parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="npcsim", description="Run LLM-driven NPCs at scale.")
    parser.add_argument("--version", action="version", version=f"npcsim {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    # The command list is the epilog, sub-commands included, so argparse's own listing is hidden.
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS)
    for group in COMMAND_GROUPS:
        group.register(subparsers)
    _list_commands(parser, subparsers)
    return parser


def _list_commands(
    parser: argparse.ArgumentParser, subparsers: argparse._SubParsersAction[Any]
) -> None:
    """`npcsim --help` ends with every command, one line each."""
    commands = _commands(subparsers, "")
    width = max(len(name) for name, _ in commands) + 2
    parser.usage = "%(prog)s [-h] [--version] [-v] COMMAND ..."
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "commands (npcsim COMMAND --help for its options):\n" + "\n".join(
        f"  {name:<{width}}{help_line}" for name, help_line in commands
    )


def _commands(
    subparsers: argparse._SubParsersAction[Any], prefix: str
) -> list[tuple[str, str]]:
    """Every runnable command (`audit replay`, not `audit`) with its one-line help.

    argparse has no public way to list sub-commands with their help, hence its private names.
    """
    commands = []
    for choice in subparsers._choices_actions:
        name = f"{prefix}{choice.dest}"
        nested = [a for a in subparsers.choices[choice.dest]._actions if isinstance(a, argparse._SubParsersAction)]
        commands += _commands(nested[0], f"{name} ") if nested else [(name, choice.help or "")]
    return commands


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    if getattr(args, "quiet", False) and not args.verbose:
        level = logging.ERROR
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not in Python's flush at exit
    except NpcsimError as exc:
        print(f"npcsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a command that does not stop in order on Ctrl-C (`run` does): one line
        print("npcsim: interrupted", file=sys.stderr)
        return 130
    except (BrokenPipeError, BaseExceptionGroup) as exc:
        if not closed_pipe(exc):
            raise
        silence_stdout()
        return 0
    return code


def console() -> NoReturn:
    """The `npcsim` program: `main()`, then an exit that leaves the heap to the kernel.

    A large run ends with gigabytes of objects, which the interpreter's own shutdown would
    free one by one, long after the run has stopped. Everything that must be
    closed (stores, brokers, temporary folders) was closed by `main`'s context managers;
    the output and the log are flushed here. An exception out of `main` exits as usual.
    """
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    console()
