"""The MQTT topic scheme (DESIGN.md, "Events and topics"): one function per topic.

Public topics (say, player input, world state, status) carry JSON; internal ones msgpack.
"""

from __future__ import annotations

import re

__all__ = [
    "ROLE_LOGINS",
    "ROOT",
    "agent_inbox",
    "agent_say",
    "barrier",
    "barrier_all",
    "check_player",
    "check_segment",
    "infer_request",
    "infer_request_shared",
    "infer_response",
    "infer_worker",
    "infer_workers",
    "location_events",
    "player_input",
    "roster",
    "run_root",
    "status",
    "trace",
    "world_state",
]

ROOT = "npcsim"
_FORBIDDEN = set("/+#\x00")
_PLAYER = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ROLE_LOGINS = frozenset({"shard", "worker", "game"})
"""The internal roles' logins (broker-config/acl): no player speaks as one. The viewer is a
role too, but the ACL lets it speak as player `viewer`, its own name, and as nothing else."""


def check_segment(kind: str, value: str) -> str:
    """A topic segment must be non-empty and free of MQTT separators and wildcards."""
    if not value or _FORBIDDEN & set(value):
        raise ValueError(f"{kind} {value!r} cannot be used in an MQTT topic (empty, or has / + # or NUL)")
    return value


def check_player(player: str) -> str:
    """A player id to speak as: 1-64 of A-Z a-z 0-9 _ . -, and not a role's login (ROLE_LOGINS)."""
    if not _PLAYER.fullmatch(player):
        raise ValueError(f"player {player[:80]!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
    if player in ROLE_LOGINS:
        raise ValueError(f"player {player!r} is an internal role's name ({', '.join(sorted(ROLE_LOGINS))})")
    return player


def run_root(run: str) -> str:
    return f"{ROOT}/{check_segment('run id', run)}"


def location_events(run: str, location: str) -> str:
    return f"{run_root(run)}/loc/{check_segment('location', location)}/events"


def agent_inbox(run: str, agent: str) -> str:
    return f"{run_root(run)}/agent/{check_segment('agent', agent)}/inbox"


def agent_say(run: str, agent: str) -> str:
    return f"{run_root(run)}/agent/{check_segment('agent', agent)}/say"


def player_input(run: str, player: str) -> str:
    return f"{run_root(run)}/player/{check_segment('player', player)}/input"


def world_state(run: str) -> str:
    return f"{run_root(run)}/world/state"


def infer_request(run: str) -> str:
    return f"{run_root(run)}/infer/req"


def infer_request_shared(run: str, group: str) -> str:
    """The shared subscription remote workers consume requests through."""
    return f"$share/{check_segment('worker group', group)}/{infer_request(run)}"


def infer_response(run: str, shard: str) -> str:
    return f"{run_root(run)}/infer/resp/{check_segment('shard', shard)}"


def infer_worker(run: str, worker: str) -> str:
    """A remote worker's status: its MQTT last will says "offline" when it dies (sim.wire.inference)."""
    return f"{run_root(run)}/infer/worker/{check_segment('worker', worker)}"


def infer_workers(run: str) -> str:
    """Every worker's status topic: what a pool watches to re-send a dead worker's requests."""
    return f"{run_root(run)}/infer/worker/+"


def status(run: str, shard: str) -> str:
    return f"{run_root(run)}/status/{check_segment('shard', shard)}"


def barrier(run: str, shard: str) -> str:
    """A shard's tick barrier messages (TickDone, Join; sim.wire.barrier)."""
    return f"{run_root(run)}/barrier/{check_segment('shard', shard)}"


def barrier_all(run: str) -> str:
    return f"{run_root(run)}/barrier/+"


def trace(run: str, shard: str) -> str:
    """Per-inference traces of one shard (JSON): the truncation report, prompt digest, prompt."""
    return f"{run_root(run)}/trace/{check_segment('shard', shard)}"


def roster(run: str, shard: str) -> str:
    """A shard's NPCs and where they are (JSON, retained): what a viewer lists."""
    return f"{run_root(run)}/roster/{check_segment('shard', shard)}"
