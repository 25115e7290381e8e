"""The run's side of the trust boundary (DESIGN.md, "Trust boundary") at start-up.

- `run_key_for`: the run key from `--run-key-file`, or a fresh one for `--broker auto`.
- `announce_trust`: say once, at start, when the broker enforces no ACL that npcsim knows
  of and no run key stands in for it (anyone who can connect could then forge internal
  events), and tell the operator how remote workers join a private `--broker auto`.

What a message may carry is checked where it arrives (sim.protocol: seal, bounds, router).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sim.broker import BrokerInfo
from sim.mqtt import ENV_PASSWORD, ENV_USERNAME
from sim.protocol.seal import RunKey, load_run_key

__all__ = ["announce_trust", "run_key_for"]

log = logging.getLogger(__name__)


def run_key_for(path: str | None, broker: BrokerInfo) -> RunKey | None:
    """The key of `--run-key-file`; without one, a fresh key when npcsim started the broker."""
    if path is not None:
        return load_run_key(path)
    return RunKey.generate() if broker.kind != "external" else None


def announce_trust(
    broker: BrokerInfo, run_id: str, run_key: RunKey | None, worker_login_dir: Path | None
) -> Path | None:
    """Log what the operator must know about this broker; returns the worker login file, if written.

    `worker_login_dir`: where to write the remote workers' login and run key for a broker
    npcsim started (files of mode 0600); None when the run has no remote workers.
    """
    if not broker.acl and broker.address.username is None and run_key is None:
        log.warning(
            "the %s broker %s is used without a login and without a run key, so anyone who can connect to it "
            "can forge internal events (NPC lines, inbox messages, inference replies). Give every process of "
            "the run --run-key-file, or use a broker with broker-config/auth.conf and acl "
            "(docs/operations.md, Security)",
            broker.kind, broker.url,
        )
    if broker.kind == "external" or worker_login_dir is None:
        return None
    login = worker_login_dir / "worker-login.env"
    login.touch(mode=0o600)
    if broker.worker.username is not None:
        login.write_text(f"{ENV_USERNAME}={broker.worker.username}\n{ENV_PASSWORD}={broker.worker.password}\n")
    key_option = ""
    if run_key is not None:
        key_file = worker_login_dir / "run.key"
        key_file.touch(mode=0o600)
        key_file.write_bytes(run_key.secret)
        key_option = f" --run-key-file {key_file}"
    log.warning(
        "remote workers join this run with: `set -a; . %s; set +a; npcsim worker --broker %s --run %s%s` "
        "(the files go away with the run)",
        login, broker.worker.with_login(None, None).url, run_id, key_option,
    )
    return login

