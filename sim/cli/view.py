"""`npcsim view`: the web page of a live run (`--run`, with `--broker`) or of a finished one (`--db`).

Without `--broker`, `--run ID` finds the run's private broker on this machine (sim.attach)
and logs in as its read-only viewer. With `--broker`, the run must be known there (a shard
of it left its retained status): a mistyped run id is an error naming the runs the broker
knows, not an empty page.

It listens on loopback unless `--allow-remote` (with NPCSIM_VIEW_PASSWORD, the login) says
otherwise, speaks as `--as-player` (default `viewer`) and nobody else; docs/operations.md,
Security, shows it behind a reverse proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sim.cli._attach import check_run, local_broker, local_login, no_local_run
from sim.cli._observe import port_number
from sim.cli._options import add_broker_arguments, broker_address, player_name, run_id
from sim.cli._terminal import Out
from sim.errors import ConfigError
from sim.scenario import load_scenario

if TYPE_CHECKING:  # imported when the command runs: aiohttp would slow every start of the CLI
    from sim.view import LiveView, ViewSource

__all__ = ["add_view_arguments", "register", "view_command", "view_password"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = subparsers.add_parser(
        "view", help="serve a web page of a run: live (--broker, --run) or stored (--db)",
        description="A web page showing the world, the dialogue, each NPC's working memory and budget, "
        "and the run's health. Live runs are read over MQTT; a store file is read-only, with a tick slider.",
    )
    add_broker_arguments(cmd, default="", found="the private broker of --run on this machine")  # "": not given
    cmd.add_argument("--run", type=run_id, default=None, metavar="ID", help="the live run's id")
    cmd.add_argument("--db", default=None, metavar="FILE", help="a finished run's shard store (read-only)")
    cmd.add_argument("--scenario", default=None, metavar="FILE",
                     help="with --db: the scenario the run was made from, for the NPCs' names and places "
                     "(a store does not keep them); a file or a bundled scenario's name")
    cmd.add_argument("--compare", default=None, metavar="OTHER.db",
                     help="with --db: another store of the run (another budget, a fork); the NPC panel shows both "
                     "working memories side by side, what the other lost or gained highlighted")
    cmd.add_argument("--port", type=port_number, default=8080, help="HTTP port (default 8080)")
    cmd.add_argument("--host", default="127.0.0.1",
                     help="HTTP address (default 127.0.0.1); beyond loopback only with --allow-remote")
    add_view_arguments(cmd)
    cmd.add_argument("--allow-remote", action="store_true",
                     help="listen beyond loopback; needs a login: the password in NPCSIM_VIEW_PASSWORD")
    cmd.add_argument("--public-url", metavar="URL",
                     help="the address browsers use when it is not http://HOST:PORT/ (a reverse proxy, "
                     "--host 0.0.0.0); the Host and Origin of every request are checked against it")
    cmd.set_defaults(func=view_command)


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    """--as-player, for `npcsim view` and `npcsim run --view`."""
    parser.add_argument("--as-player", type=player_name, default="viewer", metavar="NAME",
                        help="the player the page speaks as (default viewer); never shard, worker or game")


def view_password() -> str | None:
    """The view's login password from the environment (NPCSIM_VIEW_PASSWORD), when one is set."""
    from sim.view import ENV_PASSWORD

    return os.environ.get(ENV_PASSWORD) or None


def _source(args: argparse.Namespace) -> tuple[ViewSource, LiveView | None]:
    """Check the options and make the page's source; a bad value is one ConfigError."""
    from sim.view import LiveView, StoreComparison, StoredRun, ViewSource

    if args.scenario is not None and args.db is None:
        raise ConfigError("--scenario: only with --db (a live run's roster comes from the run)")
    if args.compare is not None and args.db is None:
        raise ConfigError("--compare: only with --db (two stored runs are compared)")
    if args.db is not None:
        if args.broker or args.run is not None:
            raise ConfigError("--db: a stored run is viewed without --broker and --run")
        path = Path(args.db)
        if not path.is_file():
            raise ConfigError(f"--db {args.db!r}: no such file")
        if args.compare is not None and not Path(args.compare).is_file():
            raise ConfigError(f"--compare {args.compare!r}: no such file")
        stored = StoredRun(path, load_scenario(args.scenario) if args.scenario is not None else None)
        comparison = StoreComparison(path, Path(args.compare)) if args.compare is not None else None
        return ViewSource(model=stored.model, live=False, ticks=(stored.first_tick, stored.last_tick),
                          compare=comparison.compare if comparison else None,
                          compare_name=comparison.other_name if comparison else None), None
    if args.run is None:
        raise ConfigError("view: give --run ID (and --broker URL for a run elsewhere) for a live run, "
                          "or --db FILE for a stored one")
    if args.broker:
        args.address = local_login(broker_address(args), args.run)
        asyncio.run(check_run(args.address, args.run, name="view"))
    else:
        found = local_broker(args.run)
        if found is None:
            raise no_local_run("--run", args.run)
        args.address = found
    live = LiveView(args.run, player=args.as_player)
    return live.source(), live


def view_command(args: argparse.Namespace) -> int:
    from sim.view.access import check_listening

    # where the page may listen is refused first, in one line, before a broker is asked about the run
    check_listening(args.host, allow_remote=args.allow_remote, password=view_password(), public_url=args.public_url)
    source, live = _source(args)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(source, live, args, Out(sys.stderr, flush=True)))
    return 0


async def _serve(source: ViewSource, live: LiveView | None, args: argparse.Namespace, banner: Out) -> None:
    from sim.view import build_app, open_view_server

    async with open_view_server(build_app(source), args.host, args.port, allow_remote=args.allow_remote,
                                password=view_password(), public_url=args.public_url) as url:
        banner.record("view: ", (url, "bold"), "  (Ctrl-C stops)")
        if live is not None:
            await live.follow(args.address, args.run)
        else:
            await asyncio.Event().wait()
