"""The topic scheme read back (`topics.parse`, the builders' inverse) and the one id rule
(`Name`) that the topics, the wire and the router share."""

from __future__ import annotations

import typing
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.protocol.bounds import InputBounds
from sim.protocol.received import InputRefused, OutsideReceived
from sim.protocol.router import Router
from sim.wire import topics
from sim.wire.events import Speech, decode_batch, is_name

KINDS: tuple[topics.TopicKind, ...] = typing.get_args(topics.TopicKind)
UNNAMED = {"world_state", "game_event", "game_fact", "game_move", "game_goal", "game_error",
           "infer_request"}  # built from the run alone

# Any segment a builder takes: non-empty, no / + # NUL (unicode, spaces and dots included).
segments = st.text(st.characters(exclude_characters="/+#\x00"), min_size=1, max_size=20)


def build(kind: topics.TopicKind, run: str, name: str) -> str:
    builder: Callable[..., str] = getattr(topics, kind)
    return builder(run) if kind in UNNAMED else builder(run, name)


def test_every_kind_has_its_builder() -> None:
    assert len(KINDS) == 21
    for kind in KINDS:
        assert callable(getattr(topics, kind)), kind


@given(st.sampled_from(KINDS), segments, segments)
def test_parse_reads_back_what_a_builder_built(kind: topics.TopicKind, run: str, name: str) -> None:
    topic = build(kind, run, name)
    expected = topics.Topic(run, kind, "" if kind in UNNAMED else name)
    assert topics.parse(topic) == expected
    assert build(expected.kind, expected.run, expected.name) == topic


# Levels a forger might put together: the scheme's words, segments with wildcards, empty ones.
levels = st.lists(st.sampled_from(["npcsim", "r", "x", "loc", "events", "agent", "inbox", "say", "player", "input",
                                   "world", "state", "infer", "req", "resp", "worker", "status", "barrier",
                                   "trace", "roster", "", "+", "#", "a+b", "$share", "g", "\x00"]),
                  min_size=0, max_size=7)


@given(levels)
def test_whatever_parses_is_what_its_builder_builds_again(parts: list[str]) -> None:
    """No topic is read as one it is not: anything parse accepts, its builder gives back exactly."""
    topic = "/".join(parts)
    parsed = topics.parse(topic)
    if parsed is not None:
        assert build(parsed.kind, parsed.run, parsed.name) == topic


@pytest.mark.parametrize("topic", [
    "", "npcsim", "npcsim/r", "npcsim/r/", "other/r/agent/a/say", "NPCSIM/r/agent/a/say", "/npcsim/r/agent/a/say",
    "npcsim//agent/a/say", "npcsim/r/agent//say", "npcsim/r/agent/a/b/say", "npcsim/r/agent/a/say/",
    "npcsim/r/agent/a", "npcsim/r/agent/a/shout", "npcsim/r/player/a/inputs", "npcsim/r/world",
    "npcsim/r/world/state/x",
    "npcsim/r/infer/req/x", "npcsim/r/infer/resp", "npcsim/r/status", "npcsim/r/status/a/b", "npcsim/r/barrier/",
    "npcsim/r/agent/+/say", "npcsim/+/status/0", "npcsim/r/#", "npcsim/r/agent/a\x00/say",
    topics.barrier_all("r"), topics.infer_workers("r"), topics.player_input_all("r"), topics.agent_location_all("r"),
    "npcsim/r/game/move/x", "npcsim/r/game/goals",
    topics.infer_request_shared("r", "g"),
])
def test_foreign_forged_and_filter_topics_are_refused(topic: str) -> None:
    assert topics.parse(topic) is None


def test_another_runs_topics_are_read_as_that_runs_and_the_router_takes_none() -> None:
    assert topics.parse(topics.player_input("other", "bob")) == topics.Topic("other", "player_input", "bob")
    r = router()
    for topic in (topics.player_input("other", "bob"), topics.barrier("other", "0"), topics.world_state("other"),
                  topics.agent_inbox("other", "snack"), "npcsim/r/agent/snack/inbox/x", "npcsim/r/player//input"):
        assert r.receive(topic, b'{"to": "snack", "text": "hi"}') is None
        assert not r.is_routed(topic)
    assert r.stats.malformed == {"unrouted": 6}


# --- one id rule --------------------------------------------------------------------------

ids = st.one_of(
    st.text(st.sampled_from("aZ09_.-"), max_size=3),
    st.text(st.sampled_from("aZ09_.- /+#é\n\t\x00:"), max_size=12),
    st.integers(120, 135).map(lambda n: "x" * n),
    st.sampled_from(["bob\n", "bob\r\n", "\nbob", "bob ", "x" * 128, "x" * 129, *topics.ROLE_LOGINS]),
)


def router() -> Router:
    r = Router("r", "0", mailbox_size=10, seen_events=100, bounds=InputBounds())
    r.route_inboxes(["snack"])
    r.route("player-input")
    r.route("world-state")
    r.route_barrier()
    return r


def topic_accepts(player: str) -> bool:
    try:
        topics.check_player(player)
    except ValueError:
        return player in topics.ROLE_LOGINS and is_name(player)  # a name, refused as a role's login
    return True


def wire_accepts(player: str) -> bool:
    speech = msgspec.structs.asdict(Speech(id="r:x:1:0", tick=1, speaker="x", text="hi", to="x"))
    batch = {"shard": "0", "tick": 1, "events": [{**speech, "type": "speech", "speaker": player, "to": player}]}
    try:
        decode_batch(msgspec.msgpack.encode(batch))
    except msgspec.ValidationError:
        return False
    return True


def router_accepts(player: str) -> bool:
    received = router().receive(f"npcsim/r/player/{player}/input", b'{"to": "snack", "text": "hi"}')
    if isinstance(received, InputRefused) and received.error.code == "not_allowed":
        return player in topics.ROLE_LOGINS  # a name, refused as a role's login
    return isinstance(received, OutsideReceived) and received.channel == "player-input" and received.name == player


@given(ids)
def test_topics_wire_and_router_accept_and_refuse_the_same_ids(player: str) -> None:
    expected = is_name(player)
    assert (topic_accepts(player), wire_accepts(player), router_accepts(player)) == (expected,) * 3, player


@pytest.mark.parametrize(("player", "accepted"), [
    ("a", True), ("x" * 128, True), ("Bob_the-2.0", True), ("", False), ("x" * 129, False), ("bob\n", False),
    ("bob smith", False), ("é", False), ("a/b", False), ("a+b", False),
])
def test_the_id_rule_at_its_edges(player: str, accepted: bool) -> None:
    assert is_name(player) is accepted
    assert (topic_accepts(player), wire_accepts(player), router_accepts(player)) == (accepted,) * 3
