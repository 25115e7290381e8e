"""The MQTT topic scheme (docs/topics.md): one function per topic, and `parse`, their inverse.

Public topics (say, intent, an NPC's location, player input, presence and errors, world state,
the game system's events, facts, moves and goals, status) carry JSON; internal ones msgpack.
Topics are built and read here only, so that what a shard publishes and what it takes
cannot drift apart.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from sim.wire.events import NAME_RULE, is_name

__all__ = [
    "ROLE_LOGINS",
    "ROOT",
    "Topic",
    "TopicKind",
    "agent_inbox",
    "agent_inbox_all",
    "agent_intent",
    "agent_location",
    "agent_location_all",
    "agent_say",
    "barrier",
    "barrier_all",
    "check_player",
    "check_segment",
    "game_error",
    "game_event",
    "game_fact",
    "game_goal",
    "game_move",
    "infer_request",
    "infer_request_shared",
    "infer_response",
    "infer_worker",
    "infer_workers",
    "location_events",
    "location_events_all",
    "parse",
    "player_error",
    "player_input",
    "player_input_all",
    "player_presence",
    "player_presence_all",
    "roster",
    "run_root",
    "status",
    "trace",
    "world_state",
]

ROOT = "npcsim"
_FORBIDDEN = set("/+#\x00")
ROLE_LOGINS = frozenset({"shard", "worker", "game"})
"""The internal roles' logins (broker-config/acl): no player speaks as one. The viewer is a
role too, but the ACL lets it speak as player `viewer`, its own name, and as nothing else."""


def _is_segment(value: str) -> bool:
    return bool(value) and _FORBIDDEN.isdisjoint(value)


def check_segment(kind: str, value: str) -> str:
    """A topic segment must be non-empty and free of MQTT separators and wildcards."""
    if not _is_segment(value):
        raise ValueError(f"{kind} {value!r} cannot be used in an MQTT topic (empty, or has / + # or NUL)")
    return value


def check_player(player: str) -> str:
    """A player id to speak as: a name (`sim.wire.events.Name`), and not a role's login (ROLE_LOGINS)."""
    if not is_name(player):
        raise ValueError(f"player {player[:80]!r} must be {NAME_RULE}")
    if player in ROLE_LOGINS:
        raise ValueError(f"player {player!r} is an internal role's name ({', '.join(sorted(ROLE_LOGINS))})")
    return player


def run_root(run: str) -> str:
    return f"{ROOT}/{check_segment('run id', run)}"


def location_events(run: str, location: str) -> str:
    return f"{run_root(run)}/loc/{check_segment('location', location)}/events"


def location_events_all(run: str) -> str:
    """Every place's events of `run` (a shard hears the places where its NPCs walk)."""
    return f"{run_root(run)}/loc/+/events"


def agent_inbox(run: str, agent: str) -> str:
    return f"{run_root(run)}/agent/{check_segment('agent', agent)}/inbox"


def agent_say(run: str, agent: str) -> str:
    return f"{run_root(run)}/agent/{check_segment('agent', agent)}/say"


def agent_intent(run: str, agent: str) -> str:
    """What an NPC proposes the game do (JSON): the game acts on it or not; the model changes nothing."""
    return f"{run_root(run)}/agent/{check_segment('agent', agent)}/intent"


def agent_location(run: str, agent: str) -> str:
    """Where an NPC stands and what it does there (JSON, retained): the shard publishes each move."""
    return f"{run_root(run)}/agent/{check_segment('agent', agent)}/location"


def agent_location_all(run: str) -> str:
    """Every NPC's location (a filter): where everyone is, from the retained messages."""
    return f"{run_root(run)}/agent/+/location"


def player_input(run: str, player: str) -> str:
    return f"{run_root(run)}/player/{check_segment('player', player)}/input"


def player_presence(run: str, player: str) -> str:
    """Where a live player stands (the game system publishes it)."""
    return f"{run_root(run)}/player/{check_segment('player', player)}/presence"


def player_error(run: str, player: str) -> str:
    """The errors of a player's refused input: only that player reads them."""
    return f"{run_root(run)}/player/{check_segment('player', player)}/error"


def player_presence_all(run: str) -> str:
    return f"{run_root(run)}/player/+/presence"


def game_event(run: str) -> str:
    """Something happened at a place: the game system's narration."""
    return f"{run_root(run)}/game/event"


def game_fact(run: str) -> str:
    """A canonical fact the game system adds at run time."""
    return f"{run_root(run)}/game/fact"


def game_move(run: str) -> str:
    """The game system moves an NPC to a place."""
    return f"{run_root(run)}/game/move"


def game_goal(run: str) -> str:
    """The game system sets (or clears) an NPC's goal."""
    return f"{run_root(run)}/game/goal"


def game_error(run: str) -> str:
    """The errors of the game system's refused messages."""
    return f"{run_root(run)}/game/error"


def agent_inbox_all(run: str) -> str:
    """Every agent's inbox (a filter): one subscription for a shard's NPCs, however many."""
    return f"{run_root(run)}/agent/+/inbox"


def player_input_all(run: str) -> str:
    """Every player's input topic: what a shard taking player input subscribes."""
    return f"{run_root(run)}/player/+/input"


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


TopicKind = Literal[
    "location_events", "agent_inbox", "agent_say", "agent_intent", "agent_location", "player_input", "player_presence",
    "player_error", "world_state", "game_event", "game_fact", "game_move", "game_goal", "game_error", "infer_request",
    "infer_response", "infer_worker", "status", "barrier", "trace", "roster",
]
"""What a topic is: the name of the function above that builds it."""


class Topic(NamedTuple):
    """A topic read back (`parse`): its run, its kind, and the name in it (the place, agent,
    player, shard or worker; "" for `world/state`, `game/...` and `infer/req`)."""

    run: str
    kind: TopicKind
    name: str = ""


def parse(topic: str) -> Topic | None:
    """The run, kind and name `topic` was built from (the inverse of the functions above), or
    None for what none of them builds: another root, another kind, a level too many or too
    few, an empty segment or one with a wildcard (a filter such as `barrier_all`'s is not a topic).

    The name is returned as it is: whether it is a known agent, or a player id (a `Name`),
    is the caller's question.
    """
    levels = topic.split("/")
    if len(levels) < 4 or levels[0] != ROOT or not _is_segment(levels[1]):
        return None
    run = levels[1]
    kind: TopicKind
    match levels[2:]:
        case ["loc", name, "events"]:
            kind = "location_events"
        case ["agent", name, "inbox"]:
            kind = "agent_inbox"
        case ["agent", name, "say"]:
            kind = "agent_say"
        case ["agent", name, "intent"]:
            kind = "agent_intent"
        case ["agent", name, "location"]:
            kind = "agent_location"
        case ["player", name, "input"]:
            kind = "player_input"
        case ["player", name, "presence"]:
            kind = "player_presence"
        case ["player", name, "error"]:
            kind = "player_error"
        case ["world", "state"]:
            return Topic(run, "world_state")
        case ["game", "event"]:
            return Topic(run, "game_event")
        case ["game", "fact"]:
            return Topic(run, "game_fact")
        case ["game", "move"]:
            return Topic(run, "game_move")
        case ["game", "goal"]:
            return Topic(run, "game_goal")
        case ["game", "error"]:
            return Topic(run, "game_error")
        case ["infer", "req"]:
            return Topic(run, "infer_request")
        case ["infer", "resp", name]:
            kind = "infer_response"
        case ["infer", "worker", name]:
            kind = "infer_worker"
        case ["status", name]:
            kind = "status"
        case ["barrier", name]:
            kind = "barrier"
        case ["trace", name]:
            kind = "trace"
        case ["roster", name]:
            kind = "roster"
        case _:
            return None
    return Topic(run, kind, name) if _is_segment(name) else None
