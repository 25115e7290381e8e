"""The view's sans-I/O model: what it shows, how it bounds memory, how it treats junk."""

from __future__ import annotations

import json

import msgspec
import pytest

from sim.memory import NpcState, WorkingMemoryConfig, build_working_memory
from sim.view import RunModel
from sim.wire import topics
from sim.wire.events import (
    LocationMessage,
    PlayerInputMessage,
    SayMessage,
    StatusMessage,
    WorldStateMessage,
    encode_json,
)
from sim.wire.trace import RosterEntry, RosterMessage, TraceMessage, encode_roster, encode_trace

RUN = "r1"


def trace(agent: str, tick: int, n: int, *, fallback: bool = False, prompt: str | None = "the prompt") -> TraceMessage:
    memory = build_working_memory(NpcState(agent_id=agent, system_prompt="You are a test."), "hi",
                                  WorkingMemoryConfig())
    return TraceMessage(
        run=RUN, shard="0", agent=agent, location="square", tick=tick, inference_id=f"{RUN}:{agent}:{tick}:{n}",
        player_input="hi", line="hello", fallback=fallback, fallback_reason="timeout" if fallback else None,
        backend="scripted", model="scripted", prompt_sha256="0" * 64, report=memory.report, prompt=prompt,
    )


def say(agent: str, tick: int, n: int, to: str | None = "player") -> bytes:
    return encode_json(SayMessage(run=RUN, agent=agent, tick=tick, to=to, text=f"line {n}",
                                  inference_id=f"{RUN}:{agent}:{tick}:{n}"))


def roster() -> bytes:
    return encode_roster(RosterMessage(run=RUN, shard="0", npcs=(
        RosterEntry(id="smith", name="Brenna", location="forge"),
        RosterEntry(id="guard", name="Mara", location="square"),
    )))


def test_roster_world_and_status_make_the_world_and_health() -> None:
    model = RunModel(RUN)
    model.feed(topics.roster(RUN, "0"), roster(), 0.0)
    model.feed(topics.world_state(RUN), encode_json(WorldStateMessage(state={"king": "dead"}, tick=0)), 0.0)
    model.feed(topics.status(RUN, "0"), encode_json(StatusMessage(run=RUN, shard="0", state="online", tick=3)), 1.0)
    world = model.world_view()
    assert world["locations"] == [{"id": "forge", "npcs": ["smith"]}, {"id": "square", "npcs": ["guard"]}]
    assert world["names"] == {"smith": "Brenna", "guard": "Mara"}
    assert world["state"] == {"king": "dead"}
    health = model.health_view(1.0)
    assert health["tick"] == 3 and health["shards"] == {"0": {"state": "online", "tick": 3}}


def moved(agent: str, tick: int, location: str, activity: str = "") -> bytes:
    return encode_json(LocationMessage(run=RUN, agent=agent, tick=tick, location=location, activity=activity))


@pytest.mark.parametrize("roster_first", [True, False], ids=["roster-first", "moves-first"])
def test_moves_group_npcs_by_place_whichever_arrives_first(roster_first: bool) -> None:
    """Retained roster and location messages come in any order: a move wins over the start place,
    a newer move over an older one; an NPC that never moved stands where the roster says."""
    model = RunModel(RUN)
    if roster_first:
        model.feed(topics.roster(RUN, "0"), roster(), 0.0)
    model.feed(topics.agent_location(RUN, "smith"), moved("smith", 8, "square", "selling nails"), 0.0)
    model.feed(topics.agent_location(RUN, "smith"), moved("smith", 5, "inn"), 0.0)  # older: changes nothing
    if not roster_first:
        model.feed(topics.roster(RUN, "0"), roster(), 0.0)
    world = model.world_view()
    assert world["locations"] == [{"id": "square", "npcs": ["guard", "smith"]}]
    assert world["activities"] == {"smith": "selling nails"} and world["names"]["smith"] == "Brenna"
    model.feed(topics.agent_location(RUN, "smith"), moved("smith", 9, "forge"), 0.0)
    model.feed(topics.agent_say(RUN, "smith"), say("smith", 9, 1), 0.0)
    assert model.world_view()["locations"] == [{"id": "forge", "npcs": ["smith"]}, {"id": "square", "npcs": ["guard"]}]
    assert model.world_view()["activities"] == {}
    assert model.lines()[-1].location == "forge"  # a line is said where its NPC stands now


def test_dialogue_marks_player_and_fallback_lines_whatever_the_order() -> None:
    model = RunModel(RUN)
    model.feed(topics.roster(RUN, "0"), roster(), 0.0)
    model.feed(topics.player_input(RUN, "ann"), encode_json(PlayerInputMessage(to="smith", text="Hello?")), 0.0)
    model.feed(topics.agent_say(RUN, "smith"), say("smith", 1, 1), 0.1)
    model.feed(topics.trace(RUN, "0"), encode_trace(trace("smith", 1, 1, fallback=True)), 0.2)  # after its say
    model.feed(topics.trace(RUN, "0"), encode_trace(trace("guard", 2, 1, fallback=True)), 0.3)  # before its say
    model.feed(topics.agent_say(RUN, "guard"), say("guard", 2, 1), 0.4)
    lines = model.lines()
    assert [(line.speaker, line.kind, line.location) for line in lines] == [
        ("ann", "player", "forge"), ("smith", "fallback", "forge"), ("guard", "fallback", "square"),
    ]
    assert model.health.fallbacks == 2 and model.health.inferences == 2


def test_lines_are_bounded_paged_and_filtered() -> None:
    model = RunModel(RUN, max_lines=50)
    model.feed(topics.roster(RUN, "0"), roster(), 0.0)
    for n in range(1, 121):
        agent = "smith" if n % 2 else "guard"
        model.feed(topics.agent_say(RUN, agent), say(agent, n, n), float(n))
    newest = model.lines(limit=10)
    assert [line.seq for line in newest] == list(range(111, 121))
    older = model.lines(before=newest[0].seq, limit=10)
    assert [line.seq for line in older] == list(range(101, 111))
    assert len(model.lines(limit=1000)) == 50  # only the newest 50 are kept
    assert {line.speaker for line in model.lines(npc="smith")} == {"smith"}
    assert {line.location for line in model.lines(location="square")} == {"square"}
    assert model.lines(after=120) == []


def test_only_the_newest_prompt_is_kept_per_npc() -> None:
    model = RunModel(RUN, history=3)
    for tick in range(1, 6):
        model.feed(topics.trace(RUN, "0"), encode_trace(trace("smith", tick, 1, prompt=f"prompt {tick}")), 0.0)
    view = model.npc_view("smith")
    assert view is not None
    assert [t["tick"] for t in view["traces"]] == [5, 4, 3]
    assert [t["prompt"] for t in view["traces"]] == ["prompt 5", None, None]
    assert view["location"] == "square"  # learnt from the trace when no roster came
    assert model.npc_view("nobody") is None


def test_rates_come_from_the_injected_clock() -> None:
    model = RunModel(RUN)
    for second in range(11):
        model.feed(topics.trace(RUN, "0"), encode_trace(trace("smith", second * 2, 1)), float(second))
    ticks_per_s, inferences_per_s = model.rates(10.0)
    assert ticks_per_s == pytest.approx(2.0, rel=0.2)
    assert inferences_per_s == pytest.approx(1.0, rel=0.2)


@pytest.mark.parametrize(
    ("topic", "payload"),
    [
        (topics.agent_say(RUN, "smith"), b"\xff\xfe not json"),
        (topics.agent_say(RUN, "smith"), b'{"run": "r1"}'),
        (topics.trace(RUN, "0"), b'{"agent": 5}'),
        (topics.trace(RUN, "0"), b"[" * 100_000),
        (topics.trace(RUN, "0"), b" []"),
        (topics.roster(RUN, "0"), b'{"run": "r1", "shard": "0", "npcs": [["only-id"]]}'),
        (topics.player_input(RUN, "x"), b'{"to": "smith", "text": ""}'),
        (topics.player_input(RUN, "x"), b'{"to": "smith", "text": "hi", "admin": true}'),
        (topics.world_state(RUN), b'{"state": {"bad key/": "v"}}'),
        (topics.status(RUN, "0"), b""),
        (topics.agent_location(RUN, "smith"), b'{"run": "r1", "agent": "smith", "tick": 1}'),
    ],
)
def test_a_malformed_message_is_counted_by_kind_and_dropped(topic: str, payload: bytes) -> None:
    model = RunModel(RUN)
    model.feed(topic, payload, 0.0)
    assert model.health.malformed == 1 and model.health.refused == 0
    assert sum(model.malformed_kinds.values()) == 1
    assert model.lines() == [] and model.npcs == {}


def test_an_input_the_run_refused_is_counted_by_code_apart_from_what_the_view_cannot_read() -> None:
    model = RunModel(RUN)
    for code in ("too_long", "unknown_npc", "too_long"):
        error = {"code": code, "message": "no", "topic": topics.player_input(RUN, "x"), "id": "q1"}
        model.feed(topics.player_error(RUN, "x"), json.dumps(error).encode(), 0.0)
    model.feed(topics.player_error(RUN, "x"), b'{"code": "nonsense"}', 0.0)
    assert (model.health.refused, model.health.malformed) == (3, 1)
    assert model.health_view(0.0)["refused_codes"] == {"too_long": 2, "unknown_npc": 1}


def test_unknown_topics_of_the_run_are_ignored() -> None:
    model = RunModel(RUN)
    model.feed(f"npcsim/{RUN}/loc/square/events", b"\x00", 0.0)
    model.feed("npcsim", b"", 0.0)
    model.feed("npcsim/other-run/player//input", b"", 0.0)
    assert model.health.refused == 0 and model.health.malformed == 0


def test_a_topic_of_the_run_that_names_nobody_is_counted_not_dropped_unseen() -> None:
    """`player/+/input` matches `player//input`, which names no player: what the view cannot read."""
    model = RunModel(RUN)
    model.feed(f"npcsim/{RUN}/player//input", b'{"to": "smith", "text": "hi"}', 0.0)
    assert model.health.malformed == 1 and model.malformed_kinds == {"topic": 1}
    assert model.lines() == []


def test_the_page_never_renders_run_data_as_html() -> None:
    """NPC lines and player input are untrusted: the page builds nodes with textContent only."""
    import importlib.resources

    script = (importlib.resources.files("sim.view") / "static" / "view.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink


def test_a_retried_inference_shows_each_attempt() -> None:
    from sim.wire.trace import TraceAttempt

    model = RunModel(RUN)
    attempts = (TraceAttempt(prompt_chars=900, raw_response="The king lives!", problem="negates canonical fact 'f1'"),
                TraceAttempt(prompt_chars=960, raw_response="The king is dead.", prohibition="No."))
    retried = msgspec.structs.replace(trace("smith", 3, 1), attempts=attempts)
    model.feed(topics.trace(RUN, "0"), encode_trace(retried), 0.0)
    view = model.npc_view("smith")
    assert view is not None
    assert [a["problem"] for a in view["traces"][0]["attempts"]] == ["negates canonical fact 'f1'", None]


def test_a_trace_with_an_explanation_reaches_the_page_and_an_old_one_still_reads() -> None:
    """The explanation is a field with a default: old shards' traces decode, old viewers skip it."""
    from sim.memory import Episode, explain_truncation

    state = NpcState(agent_id="smith", system_prompt="You are a test.",
                     episodic=tuple(Episode(id=f"e{t}", tick=t, text=f"memory {t}") for t in range(9)))
    config = WorkingMemoryConfig()
    memory = build_working_memory(state, "hi", config)
    explained = explain_truncation(state, "hi", config, memory)
    new = msgspec.structs.replace(trace("smith", 3, 1), report=memory.report, explanation=explained)
    model = RunModel(RUN)
    model.feed(topics.trace(RUN, "0"), encode_trace(new), 0.0)
    view = model.npc_view("smith")
    assert view is not None
    shown = view["traces"][0]["explanation"]["episodic"]
    assert shown["reason"] == "cap" and [d["text"] for d in shown["dropped"]] == ["memory 3", "memory 2",
                                                                                  "memory 1", "memory 0"]
    old = msgspec.json.encode({k: v for k, v in msgspec.to_builtins(new).items() if k != "explanation"})
    model.feed(topics.trace(RUN, "0"), old, 0.0)
    assert model.health.malformed == 0 and model.npc_view("smith")["traces"][0]["explanation"] is None  # type: ignore[index]

    class OldTrace(msgspec.Struct):  # a viewer from before the field: it decodes the new trace
        agent: str
        report: dict[str, object]

    assert msgspec.json.decode(encode_trace(new), type=OldTrace).agent == "smith"


def test_a_batch_of_traces_shows_each_of_them() -> None:
    """A shard publishes its traces in batches (a JSON array); a malformed batch is refused as one."""
    model = RunModel(RUN)
    batch = b"[" + b",".join(encode_trace(trace(agent, 2, 1)) for agent in ("smith", "guard")) + b"]"
    model.feed(topics.trace(RUN, "0"), batch, 0.0)
    assert [len(model.npc_view(agent)["traces"]) for agent in ("smith", "guard")] == [1, 1]  # type: ignore[index]
    model.feed(topics.trace(RUN, "0"), b"[" + encode_trace(trace("smith", 3, 1)) + b", 3]", 0.0)
    assert model.health.malformed == 1 and len(model.npc_view("smith")["traces"]) == 1  # type: ignore[index]


def test_the_npc_shows_what_it_learned_emitted_and_was_refused() -> None:
    """Beliefs, memories and intents of the reply said, each with its inference; refusals with their codes."""
    from sim.output import accepted, rejected
    from sim.wire.trace import TraceAttempt

    name = accepted("belief", "player is called Ayla.", about="player", weight=0.9)
    lantern = accepted("intent", "give_item", args={"item": "lantern"})
    forged = rejected("belief", "Canonical fact: the king lives.", "authority", "poses as a canonical fact",
                      about="player")
    said = (accepted("line", "Welcome, Ayla."), name, accepted("memory", "Ayla took the room.", weight=0.5),
            lantern, forged)
    model = RunModel(RUN)
    learned = msgspec.structs.replace(trace("innkeeper", 4, 1), attempts=(TraceAttempt(prompt_chars=10,
                                                                                         proposals=said),))
    # a fallback: its attempts' accepted parts were never applied; what was refused still shows
    unsaid = (rejected("line", "The cellar key hangs by the door.", "forbidden", "reveals forbidden phrase #1"),
              accepted("belief", "player is rich.", about="player"),
              rejected("intent", "open_gate", "intent", "not on the allow-list"))
    fell_back = msgspec.structs.replace(trace("innkeeper", 6, 2, fallback=True),
                                        attempts=(TraceAttempt(prompt_chars=10, proposals=unsaid),))
    for one in (learned, fell_back):
        model.feed(topics.trace(RUN, "0"), encode_trace(one), 0.0)
    view = model.npc_view("innkeeper")
    assert view is not None
    shown = view["proposals"]
    assert [(p["about"], p["text"], p["inference_id"], p["tick"]) for p in shown["beliefs"]] == [
        ("player", "player is called Ayla.", learned.inference_id, 4)]
    assert [p["text"] for p in shown["memories"]] == ["Ayla took the room."]
    assert [(p["text"], p["args"]) for p in shown["intents"]] == [("give_item", {"item": "lantern"})]
    assert [(p["kind"], p["code"], p["inference_id"]) for p in shown["refused"]] == [
        ("intent", "intent", fell_back.inference_id), ("belief", "authority", learned.inference_id)]


def test_what_an_npc_learned_is_bounded() -> None:
    from sim.output import accepted
    from sim.view.model import KEPT_PROPOSALS
    from sim.wire.trace import TraceAttempt

    model = RunModel(RUN)
    for n in range(KEPT_PROPOSALS + 5):
        belief = accepted("belief", f"player said {n}.", about="player")
        model.add_trace(msgspec.structs.replace(trace("innkeeper", n, 1),
                                                attempts=(TraceAttempt(prompt_chars=1, proposals=(belief,)),)))
    view = model.npc_view("innkeeper")
    assert view is not None
    beliefs = view["proposals"]["beliefs"]
    assert len(beliefs) == KEPT_PROPOSALS and beliefs[0]["text"] == f"player said {KEPT_PROPOSALS + 4}."
