"""`npcsim scenario list` and `npcsim scenario show`: the scenarios that ship with npcsim."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from sim.resources import bundled_scenario, scenario_names
from sim.scenario import parse_scenario

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `list` and `show` to the `scenario` command group."""
    listing = commands.add_parser("list", help="name the bundled scenarios (run one with `npcsim run NAME`)")
    listing.set_defaults(func=list_command)
    show = commands.add_parser("show", help="print a bundled scenario, commented: a starting point for your own")
    show.add_argument("name", help="a bundled scenario's name (see `npcsim scenario list`)")
    show.set_defaults(func=show_command)


def list_command(args: argparse.Namespace) -> int:
    table = Table(show_edge=False, title_justify="left")
    table.add_column("name")
    table.add_column("npcs", justify="right")
    table.add_column("description")
    for name in scenario_names():
        scenario = parse_scenario(bundled_scenario(name), source=f"{name} (bundled scenario)")
        table.add_row(name, str(len(scenario.npcs)), scenario.scenario.description)
    Console().print(table)
    return 0


def show_command(args: argparse.Namespace) -> int:
    # The file as it is, byte for byte: `npcsim scenario show village > my.toml` is runnable.
    sys.stdout.write(bundled_scenario(args.name))
    return 0
