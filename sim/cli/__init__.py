"""The `npcsim` command line: one parser, one small module per command group.

Every command is a function `(args) -> exit code`, so tests call `main([...])` in-process.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from sim import __version__
from sim.cli import audit, loadtest, memory, run, view, worker
from sim.errors import NpcsimError

__all__ = ["build_parser", "main"]

# Each module adds its sub-commands with `register(subparsers)`.
COMMAND_GROUPS = [memory, run, worker, audit, loadtest, view]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npcsim", description="Run LLM-driven NPCs at scale.")
    parser.add_argument("--version", action="version", version=f"npcsim {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.func(args)
    except NpcsimError as exc:
        print(f"npcsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
