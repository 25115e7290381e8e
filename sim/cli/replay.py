"""`npcsim replay --db FILE [--db FILE ...] --set KEY=VALUE ...`: the what-if with recorded replies.

Re-execution of a run (without `--set`) is not in this branch: it says so in one line.
"""

from __future__ import annotations

import argparse

from sim.cli import _whatif
from sim.errors import ConfigError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = subparsers.add_parser("replay", help="what-if over a recorded run: its snapshots under other budgets",
                                description="Rebuild every recorded inference's working memory under other "
                                "settings (--set) and report what each would have lost and gained.")
    cmd.add_argument("--db", action="append", required=True, metavar="FILE",
                     help="a store of the run (repeat for every shard's store)")
    _whatif.add_arguments(cmd)
    cmd.set_defaults(func=replay_command)


def replay_command(args: argparse.Namespace) -> int:
    if not args.set:
        raise ConfigError("replay: re-execution is not in this branch; give --set KEY=VALUE for a what-if")
    return _whatif.run(args)
