"""How to attach to a run: the lines a run prints, the run file it keeps, the broker a watcher finds.

A run on a broker npcsim started (`--broker auto`) is on a random port with generated
logins: it prints the broker's URL with the read-only `viewer` login (the shipped ACL's
role: public topics, the trace, player input) and the file holding that login's password
(the password itself only with `--show-password`), and keeps a run file (sim.attach), so
that `npcsim subscribe --run ID` and `npcsim view --run ID` find it without `--broker`; it
also prints its MQTT-over-WebSockets address for browser clients. A run on an external
broker prints the commands with that broker's URL (never its password). Either prints where
its store is (`store: PATH`): its black box, for `npcsim audit` and `npcsim memory show --db`.

A watcher names a run by its id: none of that id is an error naming the runs there are, and
two runs of one id on this machine (each on its own private broker) are an error listing
both; `--broker URL` of one of them picks it, with its viewer login from its run file.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import shlex
from collections.abc import Iterator
from pathlib import Path

from sim.attach import RunFile, find_runs, game_password_file, local_runs, password_file, published
from sim.errors import ConfigError
from sim.mqtt import BrokerAddress, Link, MqttTransport, ReconnectPolicy
from sim.shard import RunStarted
from sim.wire import topics

__all__ = ["attach_lines", "check_run", "local_broker", "local_login", "no_local_run", "published_run"]

log = logging.getLogger(__name__)

_PROBE_S = 2.0
"""How long a broker may take to connect, and then to hand over the retained statuses."""


def attach_lines(started: RunStarted, run_file: Path | None, *, show_password: bool = False) -> list[str]:
    """What a started run prints so that others can watch it, and the game system publish to
    it (each password is named by its file beside `run_file`, and printed only with
    `show_password`), and where its store is, to read during the run and after it."""
    lines = _broker_lines(started, run_file, show_password)
    if started.store is not None:
        db = shlex.quote(str(started.store))
        lines.append(f"store: {started.store}  (npcsim audit list --db {db}; "
                     f"npcsim memory show --db {db} --npc ID)")
    return lines


def _broker_lines(started: RunStarted, run_file: Path | None, show_password: bool) -> list[str]:
    run_id = started.stats.run_id
    run = shlex.quote(run_id)
    say = shlex.quote(f"{topics.run_root(run_id)}/agent/+/say")
    viewer = started.broker.viewer
    if viewer is None:  # an external broker: its URL; the login is the watcher's own
        address = started.broker.address
        return [
            f"attach: npcsim subscribe --broker {address.url} --run {run}  (npcsim view takes the same options); "
            f"any MQTT client: mosquitto_sub -h {address.host} -p {address.port} -v -t {say}"
        ]
    plain = viewer.with_login(None, None).url
    login, what = _login(viewer, "read-only login", None if run_file is None else password_file(run_file),
                         show_password)
    lines = [
        f"attach: npcsim subscribe --run {run}  (or npcsim view --run {run}: both find this run's private broker)",
        f"attach: broker {plain}, {what}: mosquitto_sub -h {viewer.host} -p {viewer.port}{login} -v -t {say}",
    ]
    game = started.broker.game
    if game is not None and game.username is not None:
        login, what = _login(game, "the game system's login", None if run_file is None else
                             game_password_file(run_file), show_password)
        event = shlex.quote(topics.game_event(run_id))
        lines.append(f"attach: {what} (world state, game events and facts, presence): mosquitto_pub -h {game.host} "
                     f"-p {game.port}{login} -t {event} -m '{{\"location\": \"...\", \"text\": \"...\"}}'")
    if started.broker.ws_url is not None:
        lines.append(f"attach: web clients: {started.broker.ws_url} (MQTT over WebSockets, same logins; "
                     "examples/web, docs/integrate.md)")
    return lines


def _login(address: BrokerAddress, role: str, secret_at: Path | None, show: bool) -> tuple[str, str]:
    """A login's mosquitto_* options and its description: the password itself only when `show`,
    else the file that holds it (`secret_at`), else how to see it."""
    if address.username is None:
        return "", "no login needed"
    if show:
        secret = shlex.quote(address.password or "")
        return f" -u {address.username} -P {secret}", f"{role} {address.username} / {secret}"
    if secret_at is not None:
        return (f' -u {address.username} -P "$(cat {shlex.quote(str(secret_at))})"',
                f"{role} {address.username}, its password in {secret_at}")
    return (f" -u {address.username} -P PASSWORD",
            f"{role} {address.username}, its PASSWORD shown by npcsim run --show-password")


@contextlib.contextmanager
def published_run(started: RunStarted) -> Iterator[Path | None]:
    """The run file of a run on a broker npcsim started, for the block, with its passwords'
    files beside it; yields its path (None for an external broker, or when no file could be kept)."""
    with contextlib.ExitStack() as stack:
        viewer, stats = started.broker.viewer, started.stats
        kept = None
        if viewer is not None:
            entry = RunFile(run=stats.run_id, shard=stats.shard, url=viewer.with_login(None, None).url,
                            username=viewer.username, password=viewer.password)
            try:
                game = started.broker.game
                kept = stack.enter_context(published(entry, game_password=None if game is None else game.password))
            except OSError as exc:
                log.warning("cannot keep the run file (subscribe and view need --broker then): %s", exc)
        yield kept


def _one(run: str, found: list[RunFile]) -> RunFile | None:
    """The one run of `found`, None for none; several are a ConfigError listing them."""
    if len(found) <= 1:
        return found[0] if found else None
    listed = "; ".join(
        f"{entry.url} (pid {entry.pid}, started {datetime.datetime.fromtimestamp(entry.started):%Y-%m-%d %H:%M:%S})"
        for entry in found
    )
    raise ConfigError(f"--run {run}: {len(found)} runs of that id on this machine's private brokers: {listed}; "
                      "pick one with --broker URL")


def local_broker(run: str) -> BrokerAddress | None:
    """The read-only login of run `run` on a private broker of this machine, or None."""
    entry = _one(run, find_runs(run))
    return entry.address() if entry is not None else None


def local_login(address: BrokerAddress, run: str) -> BrokerAddress:
    """`address`, with the viewer login of run `run` when it is that run's private broker on
    this machine (how `--broker` picks one of two runs of one id)."""
    same = [entry for entry in find_runs(run) if (a := entry.address()).host == address.host and a.port == address.port]
    entry = _one(run, same)
    return address if entry is None else entry.address()


def no_local_run(option: str, run: str) -> ConfigError:
    """There is no run `run` on this machine's private brokers: say which there are."""
    others = sorted({entry.run for entry in local_runs()})
    here = f"runs here: {', '.join(others)}" if others else "none is running here"
    return ConfigError(f"{option} {run}: no such run on a private broker of this machine ({here}); "
                       "for a run on another broker give --broker mqtt://host:port")


async def check_run(address: BrokerAddress, run: str, *, name: str) -> None:
    """The broker knows run `run` (a shard of it left its retained status), or a ConfigError
    naming the runs it knows; a broker not reached within _PROBE_S seconds is a BrokerError."""
    known: set[str] = set()

    async def session(link: Link) -> None:
        await link.subscribe([f"{topics.ROOT}/+/status/+"])
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_PROBE_S):
                async for topic, _, _ in link.messages():
                    if (status := topics.parse(topic)) is not None:
                        known.add(status.run)
                    if run in known:
                        return

    await MqttTransport(address, name=name, policy=ReconnectPolicy(patience=_PROBE_S)).run(session)
    if run not in known:
        there = f"runs there: {', '.join(sorted(known))}" if known else "it knows of no run"
        raise ConfigError(f"--run {run}: no such run on {address.url} (no shard of it left a status there; {there})")
