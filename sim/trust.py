"""The run's side of the trust boundary (DESIGN.md, "Trust boundary") that is not routing.

- `announce_trust`: say once, at start, when the broker enforces no ACL that npcsim knows
  of (anyone who can connect could then forge internal events), and tell the operator how
  remote workers log in to a private `--broker auto`.
- `limit_player_inputs`: at most N inputs per player per tick; the excess is refused and
  counted, never queued for later.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from sim.broker import BrokerInfo
from sim.events import PlayerInputMessage
from sim.mqtt import ENV_PASSWORD, ENV_USERNAME

__all__ = ["announce_trust", "limit_player_inputs"]

log = logging.getLogger(__name__)


class _Refuser(Protocol):
    def refuse(self, kind: str, where: str, why: str) -> None: ...


def announce_trust(broker: BrokerInfo, run_id: str, worker_login_dir: Path | None) -> Path | None:
    """Log what the operator must know about this broker; returns the worker login file, if written.

    `worker_login_dir`: where to write the remote workers' login for a private broker
    (mode 0600); None when the run has no remote workers.
    """
    if not broker.acl and broker.address.username is None:
        log.warning(
            "the %s broker %s is used without a login, so npcsim assumes it enforces no ACL: anyone who can "
            "connect to it can forge internal events (NPC lines, inbox messages, inference replies). Use "
            "--broker auto, or a broker with broker-config/auth.conf and acl (docs/operations.md, Security)",
            broker.kind, broker.url,
        )
    if broker.kind != "mosquitto" or worker_login_dir is None:
        return None
    path = worker_login_dir / "worker-login.env"
    path.touch(mode=0o600)
    path.write_text(f"{ENV_USERNAME}={broker.worker.username}\n{ENV_PASSWORD}={broker.worker.password}\n")
    log.warning(
        "remote workers log in to the private broker as %r: `set -a; . %s; set +a; npcsim worker --broker %s "
        "--run %s` (the file goes away with the run)",
        broker.worker.username, path, broker.worker.with_login(None, None).url, run_id,
    )
    return path


def limit_player_inputs(
    inputs: Sequence[tuple[str, PlayerInputMessage]], per_tick: int, refuser: _Refuser
) -> list[tuple[str, PlayerInputMessage]]:
    """The first `per_tick` inputs of each player, in arrival order; the rest refused and counted."""
    kept: list[tuple[str, PlayerInputMessage]] = []
    seen: dict[str, int] = {}
    for player, message in inputs:
        seen[player] = seen.get(player, 0) + 1
        if seen[player] <= per_tick:
            kept.append((player, message))
        else:
            refuser.refuse("player inputs over the per-tick bound", f"player {player!r}",
                           f"more than {per_tick} inputs in one tick")
    return kept
