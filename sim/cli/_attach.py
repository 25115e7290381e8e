"""How to attach to a run: the lines a run prints, the run file it keeps, the broker a watcher finds.

A run on a broker npcsim started (`--broker auto`) is on a random port with generated
logins: it prints the broker's URL with the read-only `viewer` login (the shipped ACL's
role: public topics, the trace, player input) and keeps a run file (sim.attach), so that
`npcsim subscribe --run ID` and `npcsim view --run ID` find it without `--broker`, and its
MQTT-over-WebSockets address for browser clients. A run on an external broker prints the
commands with that broker's URL (never its password).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
from collections.abc import Iterator

from sim.attach import RunFile, find_run, local_runs, published
from sim.errors import ConfigError
from sim.mqtt import BrokerAddress
from sim.shard import RunStarted
from sim.wire import topics

__all__ = ["attach_lines", "local_broker", "no_local_run", "published_run"]

log = logging.getLogger(__name__)


def attach_lines(started: RunStarted) -> list[str]:
    """What a started run prints so that others can watch it."""
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
    login, what = "", "no login needed"
    if viewer.username is not None:
        login = f" -u {viewer.username} -P {viewer.password}"
        what = f"read-only login {viewer.username} / {viewer.password}"
    lines = [
        f"attach: npcsim subscribe --run {run}  (or npcsim view --run {run}: both find this run's private broker)",
        f"attach: broker {plain}, {what}: mosquitto_sub -h {viewer.host} -p {viewer.port}{login} -v -t {say}",
    ]
    if started.broker.ws_url is not None:
        lines.append(f"attach: web clients: {started.broker.ws_url} (MQTT over WebSockets, same logins; "
                     "examples/web, docs/integrate.md)")
    return lines


@contextlib.contextmanager
def published_run(started: RunStarted) -> Iterator[None]:
    """The run file of a run on a broker npcsim started, for the block (nothing for an external broker)."""
    with contextlib.ExitStack() as stack:
        viewer, stats = started.broker.viewer, started.stats
        if viewer is not None:
            entry = RunFile(run=stats.run_id, shard=stats.shard, url=viewer.with_login(None, None).url,
                            username=viewer.username, password=viewer.password)
            try:
                stack.enter_context(published(entry))
            except OSError as exc:
                log.warning("cannot keep the run file (subscribe and view need --broker then): %s", exc)
        yield


def local_broker(run: str) -> BrokerAddress | None:
    """The read-only login of run `run` on a private broker of this machine, or None."""
    entry = find_run(run)
    return entry.address() if entry is not None else None


def no_local_run(option: str, run: str) -> ConfigError:
    """There is no run `run` on this machine's private brokers: say which there are."""
    others = sorted({entry.run for entry in local_runs()})
    here = f"runs here: {', '.join(others)}" if others else "none is running here"
    return ConfigError(f"{option} {run}: no such run on a private broker of this machine ({here}); "
                       "for a run on another broker give --broker mqtt://host:port")
