"""Refusals as errors a client can see, sans-I/O: the router's `InputRefused` for each bad
message on the game system's topics and players' presence, and `ErrorReplies`, which bounds
the replies a flooding client costs (docs/topics.md, "Errors")."""

from __future__ import annotations

import json
import re

from sim.protocol.bounds import ErrorReplies, InputBounds
from sim.protocol.received import InputRefused, OutsideReceived
from sim.protocol.router import Router
from sim.wire import topics
from sim.wire.events import ERROR_CODES, ErrorMessage, GameEventMessage, GameFactMessage, PresenceMessage
from tests.helpers import REPO

EVENT, FACT, PRESENCE = topics.game_event("r"), topics.game_fact("r"), topics.player_presence("r", "alice")


def router() -> Router:
    r = Router("r", "0", mailbox_size=10, seen_events=100, bounds=InputBounds(game_text_chars=20))
    for channel in ("game-event", "game-fact", "presence"):
        r.route(channel)
    return r


def code(received: object) -> str:
    assert isinstance(received, InputRefused), received
    assert received.player is None  # the game system's topics: the game system's errors
    return received.error.code


def test_the_game_systems_messages_come_back_as_events() -> None:
    r = router()
    assert r.receive(EVENT, b'{"location": "inn", "text": "A fire"}') == OutsideReceived(
        "game-event", "", GameEventMessage(location="inn", text="A fire"))
    assert r.receive(FACT, b'{"id": "war", "text": "War", "npc": "smith"}') == OutsideReceived(
        "game-fact", "", GameFactMessage(id="war", text="War", npc="smith"))
    assert r.receive(PRESENCE, b'{"location": null}') == OutsideReceived(
        "presence", "alice", PresenceMessage(location=None))


def test_each_bad_game_message_is_refused_with_its_code() -> None:
    r = router()
    assert code(r.receive(EVENT, b"fire!")) == "not_json"
    assert code(r.receive(EVENT, b'{"location": "inn", "text": "A fire", "who": "me"}')) == "schema"
    assert code(r.receive(EVENT, b'{"location": "inn", "text": "A fire", "significance": 2}')) == "schema"
    assert code(r.receive(EVENT, json.dumps({"location": "inn", "text": "x" * 21}).encode())) == "too_long"
    too_long = r.receive(FACT, json.dumps({"id": "f9", "text": "x" * 21}).encode())
    assert code(too_long) == "too_long" and isinstance(too_long, InputRefused) and too_long.error.id == "f9"
    assert code(r.receive(FACT, b'{"id": "has space", "text": "x"}')) == "schema"
    assert code(r.receive(topics.player_presence("r", "not a name"), b'{"location": "inn"}')) == "schema"
    assert code(r.receive(EVENT, b'{"location": "inn", "text": "A fire"}', retained=True)) == "retained"
    assert r.stats.refused == {"game event too long": 1, "game fact too long": 1, "retained game input": 1}
    assert r.stats.malformed == {"game event": 3, "game fact": 1, "player presence": 1}


def test_a_flood_costs_a_bounded_number_of_replies_then_one_rate_limited_per_window() -> None:
    replies = ErrorReplies(per_window=3, window=10.0)
    error = ErrorMessage(code="not_json", message="no", topic="t", id="q")
    sent = [replies.admit("alice", error, now=float(n) / 100) for n in range(50)]
    assert [e.code for e in sent if e is not None] == ["not_json"] * 3 + ["rate_limited"]
    assert sent[3] == ErrorMessage(code="rate_limited", message=sent[3].message, topic="t", id="q")  # type: ignore[union-attr]
    assert replies.held == 47
    assert replies.admit("bob", error, now=1.0) == error  # another client has its own window
    assert replies.admit("alice", error, now=10.0) == error  # a new window
    assert replies.admit(None, error, now=10.0) == error  # the game system is a client too


def test_a_flood_of_client_ids_keeps_the_table_bounded() -> None:
    replies = ErrorReplies(per_window=1, window=10.0, clients=100)
    error = ErrorMessage(code="schema", message="no", topic="t")
    answered = sum(replies.admit(f"p{n}", error, now=0.0) is not None for n in range(1000))
    assert answered == 100 and replies.held == 900
    assert replies.admit("late", error, now=11.0) == error  # the ended windows are forgotten


def test_docs_list_every_code_and_no_other() -> None:
    errors = (REPO / "docs" / "topics.md").read_text().split("## Errors", 1)[1]
    assert re.findall(r"^\| `(\w+)` \|", errors, re.MULTILINE) == list(ERROR_CODES)


def test_every_refusal_echoes_the_inputs_id_when_it_has_a_valid_one() -> None:
    r = router()
    r.route("player-input")
    payload = b'{"to": "innkeeper", "text": "hi", "id": "q7"}'
    for topic, retained, code in (
        (topics.player_input("r", "game"), False, "not_allowed"),  # a player calling itself an internal role
        (topics.player_input("r", "bad name"), False, "schema"),
        (topics.player_input("r", "alice"), True, "retained"),
    ):
        refusal = r.receive(topic, payload, retained=retained)
        assert isinstance(refusal, InputRefused) and (refusal.error.code, refusal.error.id) == (code, "q7"), topic


def test_an_empty_payload_clears_a_retained_message_and_gets_no_reply() -> None:
    r = router()
    r.route("player-input")
    for topic in (topics.player_input("r", "alice"), FACT, EVENT, PRESENCE):
        assert r.receive(topic, b"", retained=True) is None, topic  # as a broker sends the clear
        assert r.receive(topic, b"") is None, topic  # and as a live subscriber gets it
    assert r.stats.malformed == {}
    assert r.stats.refused == {"empty player message (a retained one cleared)": 2,
                               "empty game message (a retained one cleared)": 6}
