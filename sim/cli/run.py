"""`npcsim run` and `npcsim scenario generate`.

A run prints, on standard error, where to watch it: the view's address, how to attach and
where its store is (sim.cli._attach); on standard output the dialogue (`--follow`, `--dialogue`) and the
summary, one record per line in a pipe. `--quiet` prints nothing but errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.live import Live
from rich.table import Table

from sim.cli import bundled
from sim.cli._attach import attach_lines, published_run
from sim.cli._observe import ViewOptions, add_metrics_argument, metrics_served, port_number, run_observed
from sim.cli._options import (
    BACKEND_OPTIONS,
    add_backend_arguments,
    add_broker_arguments,
    add_set_argument,
    backend_options,
    run_id,
    whole,
)
from sim.cli._terminal import Out
from sim.cli.subscribe import say_record
from sim.cli.view import add_view_arguments, view_password
from sim.errors import ConfigError
from sim.generate import write_scenario
from sim.settings import parse_settings, with_settings
from sim.shard import (
    BrokerConfig,
    InferenceConfig,
    Placement,
    RecordConfig,
    RunConfig,
    RunStarted,
    RunStats,
    StartupPhase,
    parse_shard,
    run,
)

__all__ = ["RUNS_ENV", "register", "summary_rows"]

RUNS_ENV = "NPCSIM_RUNS"
"""The environment variable naming the folder a run without `--db` keeps its store in (default ./runs)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = subparsers.add_parser("run", help="run a scenario (one shard)")
    cmd.add_argument("scenario", help="scenario TOML file, or a bundled scenario's name (npcsim scenario list)")
    add_broker_arguments(cmd, default="auto", auto=True, tls=False)
    horizon = cmd.add_mutually_exclusive_group()
    horizon.add_argument("--ticks", type=whole(1), default=None, help="ticks to run (default: the scenario's)")
    horizon.add_argument("--until-tick", type=whole(1), default=None, metavar="T",
                         help="run up to and including tick T-1, from tick 0 or (with --resume) where the store is")
    cmd.add_argument("--tick-ms", type=whole(0), default=0,
                     help="milliseconds per tick of a quiet world (outside input begins the next tick at once); "
                          "0 = as fast as possible")
    cmd.add_argument("--seed", type=int, default=None)
    cmd.add_argument("--run-id", type=run_id, default=None, help="run id (default: scenario name and seed)")
    cmd.add_argument("--db", default=None,
                     help=f"SQLite file for this shard (default: a new file in ${RUNS_ENV} or ./runs, which keeps "
                     "the newest 10: --set record.runs_kept=N; --resume continues the run's newest there)")
    add_backend_arguments(cmd)
    cmd.add_argument("--remote-workers", action="store_true",
                     help="send inferences to `npcsim worker` processes on the broker instead of in-process "
                     "(--set inference.placement=remote)")
    cmd.add_argument("--run-key-file", metavar="FILE",
                     help="sign internal messages with this secret (HMAC; every process of the run needs it); "
                     "generated for --broker auto")
    cmd.add_argument("--shard", default="0/1",
                     help="i/n: run shard i of n (every shard of a run on the same --broker mqtt://...)")
    cmd.add_argument("--resume", action="store_true", help="continue from the stored tick")
    cmd.add_argument("--quiet", action="store_true", help="print nothing but errors (no display, no summary)")
    cmd.add_argument("--show-password", action="store_true",
                     help="--broker auto: print the watchers' read-only password and the game system's in the "
                     "attach lines (by default each line names the file, mode 0600, that holds it)")
    cmd.add_argument("--dialogue", action="store_true", help="print the dialogue after the run")
    cmd.add_argument("--follow", action="store_true", help="print each line as it is said (no live display)")
    cmd.add_argument("--view", type=port_number, default=None, metavar="PORT",
                     help="serve the web view of the run on http://127.0.0.1:PORT/ (loopback only)")
    add_view_arguments(cmd)
    add_metrics_argument(cmd)
    cmd.add_argument("--stable-prefix", action=argparse.BooleanOptionalAction, default=None,
                     help="move the start of each memory category only in steps, so that an NPC's prompts "
                     "extend each other and a model server's cache reuses them (default: the scenario's [memory])")
    add_set_argument(cmd, "memory.KEY (the scenario's [memory]), inference.KEY, inference.backend_options.NAME, "
                     "limits.KEY, record.KEY, broker.KEY, bots, ... (the fields of RunConfig)")
    cmd.set_defaults(func=run_command)

    scenario = subparsers.add_parser("scenario", help="scenario tools")
    scmds = scenario.add_subparsers(dest="scenario_command", required=True, metavar="COMMAND")
    gen = scmds.add_parser(
        "generate", help="write a large generated world",
        description="Write a scenario of N NPCs spread evenly over L locations (NPC n{i} stands at l{i %% L}), "
        "each with a trade drawn from the seed: a world for scale runs and load tests.",
    )
    gen.add_argument("--npcs", type=whole(1), required=True, metavar="N", help="number of NPCs (>= 1)")
    gen.add_argument("--locations", type=whole(1), required=True, metavar="L", help="number of locations (>= 1)")
    gen.add_argument("--seed", type=int, default=0,
                     help="seed of the NPCs' trades and of the scenario's run (default 0)")
    gen.add_argument("--out", required=True, metavar="FILE", help="the TOML file to write (replaced if it exists)")
    gen.add_argument("--day", action="store_true",
                     help="give the world a day of 24 ticks and each NPC a schedule: at work (at home for about "
                     "half of them) from 8 to 18, at home the rest of the day")
    gen.set_defaults(func=generate_command)
    bundled.register(scmds)


def _progress(stats: RunStats) -> Table:
    elapsed = max(time.monotonic() - stats.started, 1e-9)
    bus = stats.bus
    table = Table(show_header=False, box=None)
    table.add_row("run", f"{stats.run_id} shard {stats.shard} on {stats.broker}")
    if stats.startup_progress.phase != StartupPhase.RUNNING:
        table.add_row("start-up", stats.startup_progress.describe())
    table.add_row("tick", f"{max(stats.tick, 0)} / {stats.last_tick}")
    table.add_row("events/s", f"{(bus.events_delivered if bus else 0) / elapsed:,.0f}")
    table.add_row("inferences/s", f"{stats.inferences / elapsed:,.1f}")
    table.add_row("lines said", str(stats.lines))
    for server, limit in sorted(stats.server_limits.items()):
        table.add_row(f"in flight at most: {server}", str(limit))
    if stats.awaiting and stats.awaiting_since is not None:
        waited = time.monotonic() - stats.awaiting_since
        table.add_row("waiting for", f"{stats.awaiting} (for {waited:,.0f} s)")
    return table


def _rate(per_second: float) -> str:
    """A rate with one decimal, or three significant digits below 1 (a million-NPC run
    does a few ticks a minute: "0.0" would say nothing)."""
    return f"{per_second:,.1f}" if per_second >= 1 else f"{per_second:.3g}"


def summary_rows(stats: RunStats) -> list[tuple[str, str]]:
    """The figures of a finished run, one (measure, value) each; the rates are over the ticks'
    time, start-up left out (it is a row of its own)."""
    now = time.monotonic()
    ticking_since = stats.started if stats.running_since is None else stats.running_since
    elapsed = max(now - ticking_since, 1e-9)
    bus = stats.bus
    ticks = stats.ticks_done
    rows: list[tuple[str, object]] = [("agents", stats.agents)]
    if stats.running_since is not None:
        rows.append(("start-up (s)", f"{stats.running_since - stats.started:,.1f}"))
    rows += [
        ("ticks", ticks),
        ("ticks/s", _rate(ticks / elapsed)),
        ("player inputs", stats.player_inputs),
        ("ticks begun early (outside input)", stats.early_ticks),
        ("inputs answered in the tick under way", stats.joined_turns),
        ("inferences", stats.inferences),
        ("inferences per NPC-tick", f"{stats.inferences_per_npc_tick:.4f}"),
        ("NPC moves", stats.npc_moves),
        ("fallback lines", stats.fallbacks),
        ("over-budget prompts", stats.over_budget),
        *_prompt_token_rows(stats),
        *_prefix_rows(stats),
        *_server_rows(stats),
        ("lines said", stats.lines),
        ("world-state changes applied", stats.world_changes),
        ("barrier stalls", stats.stalls),
        ("barrier wait/tick (ms)", f"{1000 * stats.barrier_seconds / max(stats.barrier_ticks, 1):,.1f}"),
    ]
    if stats.memories_pruned:
        rows.append(("memory rows pruned", stats.memories_pruned))
    rows += [(f"gate verdicts: {code}", n) for code, n in sorted(stats.verdicts.items())]
    if bus is not None:
        rows += [
            ("events delivered", bus.events_delivered),
            ("events delivered/s", f"{bus.events_delivered / elapsed:,.0f}"),
            ("duplicates dropped", bus.duplicates + bus.redelivered),
            ("malformed dropped", sum(bus.malformed.values())),
            ("reconnects", bus.reconnects),
            ("mailbox overflow dropped", bus.mailbox_overflow),
        ]
        rows += [(f"refused: {kind}", n) for kind, n in sorted(bus.refused.items())]
        if bus.error_replies or bus.errors_held:
            rows += [("error replies sent", bus.error_replies), ("error replies held back", bus.errors_held)]
    rows.append(("stopped by signal", "yes" if stats.stopped_by_signal else "no"))
    return [(name, str(value)) for name, value in rows]


def _prompt_token_rows(stats: RunStats) -> list[tuple[str, object]]:
    """What the model server said the prompts cost: none when it said nothing."""
    total = stats.prompt_tokens_evaluated + stats.prompt_tokens_cached
    if not total:
        return []
    return [
        ("prompt tokens evaluated", f"{stats.prompt_tokens_evaluated:,}"),
        ("prompt tokens reused (cache)", f"{stats.prompt_tokens_cached:,}"),
        ("prompt cache hit share", f"{100 * stats.prompt_tokens_cached / total:.1f}%"),
    ]


def _prefix_rows(stats: RunStats) -> list[tuple[str, object]]:
    """How much of each prompt a cache holding the NPC's previous one could reuse, and what
    `stable_prefix` cost: none before an NPC spoke twice."""
    if not stats.prefix_reuse_pairs:
        return []
    return [
        ("prompt prefix reuse (chars)", f"{100 * stats.prefix_reuse_share / stats.prefix_reuse_pairs:.1f}%"),
        ("kept chars given up (stable prefix)", f"{stats.stable_cost_chars:,}"),
    ]


def _server_rows(stats: RunStats) -> list[tuple[str, object]]:
    """Each model server's answers and the limit it settled on: none when the backend names no server."""
    rows: list[tuple[str, object]] = []
    for server in sorted(stats.answered_by.keys() | stats.server_limits.keys()):
        rows.append((f"answered by {server}", stats.answered_by.get(server, 0)))
        if server in stats.server_limits:
            rows.append((f"in flight at most: {server}", stats.server_limits[server]))
    return rows


def _print_summary(out: Out, stats: RunStats) -> None:
    out.table(("measure", "value"), summary_rows(stats), title=f"run {stats.run_id}, shard {stats.shard}",
              right=("value",))


def _check_shards(config: RunConfig) -> None:
    """Shards of one run meet on one broker: each would start its own private one."""
    _, count = parse_shard(config.shard)
    if count > 1 and config.broker.url == "auto":
        raise ConfigError(
            f"--shard {config.shard}: each shard would start its own private broker: "
            "give every shard the same --broker mqtt://..."
        )


def _config(args: argparse.Namespace) -> RunConfig:
    """The run the flags and the `--set` settings (which win) describe; a bad setting is a
    ConfigError naming it."""
    settings = parse_settings(args.set)
    memory: dict[str, object] = {} if args.stable_prefix is None else {"stable_prefix": args.stable_prefix}
    memory.update((k.removeprefix("memory."), v) for k, v in settings.items() if k.startswith("memory."))
    placement: Placement = "remote" if args.remote_workers else "auto"
    asked = settings.get("inference.placement")
    if args.remote_workers and asked is not None and asked != "remote":
        raise ConfigError(f"--remote-workers and --set inference.placement={asked}: inferences go to one or the other")
    config = RunConfig(
        scenario=args.scenario,
        shard=args.shard,
        seed=args.seed,
        run_id=args.run_id,
        ticks=args.ticks,
        until_tick=args.until_tick,
        tick_ms=args.tick_ms,
        broker=BrokerConfig(url=args.broker, run_key_file=args.run_key_file),
        inference=InferenceConfig(backend=args.backend, backend_options=backend_options(args, settings),
                                  placement=placement),
        record=RecordConfig(db=args.db, resume=args.resume, runs_dir=os.environ.get(RUNS_ENV) or "runs",
                            keep_dialogue=(args.dialogue or args.follow) and not args.quiet),
        memory=memory,
    )
    rest = {k: v for k, v in settings.items() if not k.startswith(("memory.", BACKEND_OPTIONS))}
    return with_settings(config, rest)


def run_command(args: argparse.Namespace) -> int:
    config = _config(args)
    _check_shards(config)
    out = Out(flush=True)
    banner = Out(sys.stderr)
    stats = RunStats()
    with contextlib.ExitStack() as published:

        def ready(started: RunStarted) -> None:
            """The run has started: say how to attach, and let `subscribe`/`view` find a private broker."""
            run_file = published.enter_context(published_run(started))
            if not args.quiet:
                for line in attach_lines(started, run_file, show_password=args.show_password):
                    banner.record(line)

        with metrics_served(args.metrics_port, banner) as metrics:
            live = not args.quiet and out.terminal and not args.follow
            if metrics is None and args.view is None and not args.follow:
                asyncio.run(_run_live(config, stats, out, ready, live=live))
            else:
                follow = None if args.quiet or not args.follow else (lambda say: out.record(*say_record(say)))
                view = None if args.view is None else ViewOptions(port=args.view, player=args.as_player,
                                                                  password=view_password())
                asyncio.run(run_observed(config, stats, banner, metrics=metrics, view=view,
                                         follow=follow, on_ready=ready))
    if args.quiet:
        return 0
    for say in stats.dialogue:
        out.record(*say_record(say))
    _print_summary(out, stats)
    return 0


async def _run_live(
    config: RunConfig, stats: RunStats, out: Out, on_ready: Callable[[RunStarted], None], *, live: bool
) -> None:
    if not live:
        await run(config, stats=stats, on_ready=on_ready)
        return
    with Live(_progress(stats), console=out.console, refresh_per_second=4, transient=True) as display:
        async with asyncio.TaskGroup() as group:
            job = group.create_task(run(config, stats=stats, on_ready=on_ready))
            while not job.done():
                display.update(_progress(stats))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.25):
                        await asyncio.shield(job)


def generate_command(args: argparse.Namespace) -> int:
    try:
        path = write_scenario(Path(args.out), npcs=args.npcs, locations=args.locations, seed=args.seed, day=args.day)
    except OSError as exc:
        raise ConfigError(f"--out {args.out!r}: cannot write the scenario: {exc.strerror or exc}") from exc
    Out().record(f"wrote {args.npcs} NPCs in {args.locations} locations to {path}")
    return 0
