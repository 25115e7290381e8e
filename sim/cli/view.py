"""`npcsim view`: the web page of a live run (`--broker --run`) or of a finished one (`--db`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from sim.cli._broker import add_broker_arguments, broker_address
from sim.cli._observe import port_number
from sim.cli._values import run_id
from sim.errors import ConfigError
from sim.scenario import load_scenario

if TYPE_CHECKING:  # imported when the command runs: aiohttp would slow every start of the CLI
    from sim.view import LiveView, ViewSource

__all__ = ["register", "view_command"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = subparsers.add_parser(
        "view", help="serve a web page of a run: live (--broker, --run) or stored (--db)",
        description="A web page showing the world, the dialogue, each NPC's working memory and budget, "
        "and the run's health. Live runs are read over MQTT; a store file is read-only, with a tick slider.",
    )
    add_broker_arguments(cmd, default="")  # "": not given (a stored run needs no broker)
    cmd.add_argument("--run", type=run_id, default=None, metavar="ID", help="the live run's id")
    cmd.add_argument("--db", default=None, metavar="FILE", help="a finished run's shard store (read-only)")
    cmd.add_argument("--scenario", default=None, metavar="FILE",
                     help="with --db: the scenario the run was made from, for the NPCs' names and places "
                     "(a store does not keep them); a file or a bundled scenario's name")
    cmd.add_argument("--port", type=port_number, default=8080, help="HTTP port (default 8080)")
    cmd.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    cmd.set_defaults(func=view_command)


def _source(args: argparse.Namespace) -> tuple[ViewSource, LiveView | None]:
    """Check the options and make the page's source; a bad value is one ConfigError."""
    from sim.view import LiveView, StoredRun, ViewSource

    if args.scenario is not None and args.db is None:
        raise ConfigError("--scenario: only with --db (a live run's roster comes from the run)")
    if args.db is not None:
        if args.broker or args.run is not None:
            raise ConfigError("--db: a stored run is viewed without --broker and --run")
        path = Path(args.db)
        if not path.is_file():
            raise ConfigError(f"--db {args.db!r}: no such file")
        stored = StoredRun(path, load_scenario(args.scenario) if args.scenario is not None else None)
        return ViewSource(model=stored.model, live=False, ticks=(stored.first_tick, stored.last_tick)), None
    if not args.broker or args.run is None:
        raise ConfigError("view: give --broker URL and --run ID for a live run, or --db FILE for a stored one")
    args.address = broker_address(args)
    live = LiveView(args.run)
    return live.source(), live


def view_command(args: argparse.Namespace) -> int:
    source, live = _source(args)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(source, live, args, Console()))
    return 0


async def _serve(source: ViewSource, live: LiveView | None, args: argparse.Namespace, console: Console) -> None:
    from sim.view import build_app, open_view_server

    async with open_view_server(build_app(source), args.host, args.port) as url:
        console.print(f"view: [bold]{url}[/]  (Ctrl-C stops)")
        if live is not None:
            await live.follow(args.address, args.run)
        else:
            await asyncio.Event().wait()
