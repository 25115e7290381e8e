"""`npcsim scenario list` and `npcsim scenario show`: the scenarios that ship with npcsim."""

from __future__ import annotations

import argparse
import sys

from sim.cli._terminal import Out
from sim.resources import bundled_scenario, scenario_names
from sim.scenario import parse_scenario

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `list` and `show` to the `scenario` command group."""
    listing = commands.add_parser("list", help="name the bundled scenarios (run one with `npcsim run NAME`)")
    listing.add_argument("--json", action="store_true",
                         help="JSON Lines: one object per scenario (name, npcs, description)")
    listing.set_defaults(func=list_command)
    show = commands.add_parser("show", help="print a bundled scenario, commented: a starting point for your own")
    show.add_argument("name", help="a bundled scenario's name (see `npcsim scenario list`)")
    show.set_defaults(func=show_command)


def list_command(args: argparse.Namespace) -> int:
    out = Out()
    rows = []
    for name in scenario_names():
        scenario = parse_scenario(bundled_scenario(name), source=f"{name} (bundled scenario)")
        if args.json:
            out.json({"name": name, "npcs": len(scenario.npcs), "description": scenario.scenario.description})
        else:
            rows.append((name, str(len(scenario.npcs)), scenario.scenario.description))
    if not args.json:
        out.table(("name", "npcs", "description"), rows, right=("npcs",), whole=("name", "npcs"),
                  stretch="description")
    return 0


def show_command(args: argparse.Namespace) -> int:
    # The file as it is, byte for byte: `npcsim scenario show village > my.toml` is runnable.
    sys.stdout.write(bundled_scenario(args.name))
    return 0
