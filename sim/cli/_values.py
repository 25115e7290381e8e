"""Argument types for command-line values: a bad value is one line naming option and value.

argparse reports a type's `ArgumentTypeError` as "argument --x: <message>" and exits 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from sim.wire import topics

__all__ = ["add_fact_guard_argument", "milliseconds", "player_name", "run_id", "seconds", "segment", "whole"]


def whole(minimum: int) -> Callable[[str], int]:
    """A whole number >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _number(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of {unit}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of {unit}, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    value = _number(text, "seconds")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def milliseconds(text: str) -> float:
    """A finite number of milliseconds >= 0."""
    value = _number(text, "milliseconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds >= 0, got {text!r}")
    return value


def segment(kind: str) -> Callable[[str], str]:
    """A value that becomes an MQTT topic segment (run id, worker group): non-empty, no / + # NUL."""

    def parse(text: str) -> str:
        try:
            return topics.check_segment(kind, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


run_id = segment("run id")


def player_name(text: str) -> str:
    """The player a view speaks as (`topics.check_player`): a name, never an internal role's."""
    try:
        return topics.check_player(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_fact_guard_argument(parser: argparse.ArgumentParser) -> None:
    """`--fact-guard MODULE:NAME`, the same for a run and its remote workers (docs/inference.md)."""
    parser.add_argument("--fact-guard", default="", metavar="MODULE:NAME",
                        help="the output check's fact guard, a callable (line, facts) -> fact or None "
                        "(default: the built-in one); a run's remote workers need the same")
