"""Watching from the command line: `--metrics-port`, `run --view` and `run --follow`.

Shared by `npcsim run`, `worker` and `loadtest`; the `view` command lives in `sim.cli.view`.
`sim.view` (aiohttp) is imported only when a view is asked for: it would slow every start
of the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import msgspec

from sim.cli._terminal import Out, silence_stdout
from sim.errors import single_error
from sim.metrics import Metrics, serve_metrics
from sim.shard import RunConfig, RunStarted, RunStats, run
from sim.wire.events import SayMessage

if TYPE_CHECKING:  # sim.view is imported when a view is asked for (see above)
    from sim.view import ViewThread

__all__ = ["ViewOptions", "add_metrics_argument", "metrics_served", "port_number", "run_observed"]


class ViewOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The view beside a run: its port (on loopback), the player it speaks as, its login."""

    port: int
    player: str
    password: str | None = None
    host: str = "127.0.0.1"


def port_number(text: str) -> int:
    """A TCP port 1-65535 (0 would pick a random one nobody can find)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number 1-65535, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 1-65535, got {value}")
    return value


def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=port_number, default=None, metavar="PORT",
                        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics")


@contextlib.contextmanager
def metrics_served(port: int | None, out: Out) -> Iterator[Metrics | None]:
    """A `Metrics` served on `port` for the block, or None when no port was asked for."""
    if port is None:
        yield None
        return
    metrics = Metrics()
    with serve_metrics(metrics, port) as bound:
        out.record(f"metrics: http://127.0.0.1:{bound}/metrics")
        yield metrics


async def run_observed(
    config: RunConfig,
    stats: RunStats,
    banner: Out,
    *,
    metrics: Metrics | None,
    view: ViewOptions | None,
    follow: Callable[[SayMessage], None] | None,
    on_ready: Callable[[RunStarted], None] | None = None,
) -> None:
    """Run the shard with the view beside it (its address printed first, on `banner`) and/or
    the dialogue printed live by `follow`; `on_ready` is called once the run has started.

    When the reader of the dialogue goes away (`| head -1`), the run stops after the current
    tick and the rest of the output is dropped.
    """
    with contextlib.ExitStack() as stack:
        thread = None
        if view is not None:
            from sim.view import open_view_thread

            thread = stack.enter_context(open_view_thread(
                view.host, view.port, player=view.player, password=view.password, option="--view"))
            banner.record("view: ", (thread.url, "bold"), "  (Ctrl-C stops the run)")

        def ready(started: RunStarted) -> None:
            if thread is not None:
                thread.attach(started.broker.address, started.stats.run_id)
            if on_ready is not None:
                on_ready(started)

        stop = asyncio.Event()  # set by SIGINT/SIGTERM too (the shard process's handlers)
        try:
            async with asyncio.TaskGroup() as group:
                job = group.create_task(run(config, stats=stats, stop=stop, on_ready=ready, metrics=metrics))
                helpers = []
                if thread is not None:
                    helpers.append(group.create_task(_detach_on_stop(thread, stop)))
                if follow is not None:
                    helpers.append(group.create_task(_print_dialogue(stats, follow, stop)))
                try:
                    await asyncio.shield(job)
                finally:
                    for helper in helpers:
                        helper.cancel()
        except BaseExceptionGroup as group_error:
            raise single_error(group_error) from None
        if follow is not None:
            _print_new(stats, follow)


async def _detach_on_stop(view: ViewThread, stop: asyncio.Event) -> None:
    """Let go of the run's broker before the stopping run closes it (no "connection lost" warning)."""
    await stop.wait()
    view.detach()


async def _print_dialogue(stats: RunStats, show: Callable[[SayMessage], None], stop: asyncio.Event) -> None:
    try:
        while True:
            _print_new(stats, show)
            await asyncio.sleep(0.2)
    except BrokenPipeError:
        silence_stdout()  # the reader went away: the rest goes nowhere, and the run stops in order
        stop.set()


def _print_new(stats: RunStats, show: Callable[[SayMessage], None]) -> None:
    """Print the lines said since the last call and forget them (a long run keeps no history)."""
    taken = list(stats.dialogue)
    del stats.dialogue[: len(taken)]
    for say in taken:
        show(say)
