"""Unit tests of the seed behaviour of the working memory."""

from __future__ import annotations

import msgspec
import pytest

from sim.errors import ConfigError
from sim.memory import (
    Belief,
    Episode,
    Fact,
    Line,
    NpcState,
    OverBudgetError,
    WorkingMemory,
    WorkingMemoryConfig,
    WorldFact,
    build_working_memory,
    token_counter,
)
from sim.memory.render import CATEGORY_HEADERS, rendered, token_sizes


def big_state(n: int = 30) -> NpcState:
    return NpcState(
        "smith",
        "You are the smith.",
        canonical_facts=[Fact("f-king", "The king is dead."), Fact("f-mayor", "The player killed the mayor.")],
        world_state=[WorldFact("season", "autumn")],
        episodic=[Episode(f"e{i:03}", i, f"memory {i:03}") for i in range(n)],
        beliefs=[Belief(f"b{i:03}", i, f"belief {i:03}") for i in range(n)],
        dialogue=[Line(i, "player", f"line {i:03}") for i in range(n)],
    )


def test_default_caps_keep_the_newest_items() -> None:
    wm = build_working_memory(big_state(), "hello")
    assert [line.text for line in wm.dialogue] == [f"line {i:03}" for i in range(20, 30)]
    assert [e.id for e in wm.episodic] == [f"e{i:03}" for i in range(25, 30)]
    assert [b.id for b in wm.beliefs] == ["b027", "b028", "b029"]
    assert wm.report.dialogue.dropped == 20 and wm.report.episodic.kept == 5 and wm.report.beliefs.kept == 3


def test_fixed_split_is_60_25_15_with_integer_floors() -> None:
    config = WorkingMemoryConfig(max_context_chars=777, redistribute_unused=False)
    wm = build_working_memory(big_state(), "hello", config)
    flexible = 777 - wm.report.mandatory_chars
    assert wm.report.dialogue.budget == int(flexible * 0.60)
    assert wm.report.episodic.budget == int(flexible * 0.25)
    assert wm.report.beliefs.budget == int(flexible * 0.15)
    for name in ("dialogue", "episodic", "beliefs"):
        category = getattr(wm.report, name)
        assert category.used <= category.budget


def test_redistribution_gives_unused_budget_to_others() -> None:
    state = NpcState("smith", "Smith.", dialogue=[Line(i, "p", "x" * 40) for i in range(30)])
    fixed = build_working_memory(state, "", WorkingMemoryConfig(max_context_chars=400, redistribute_unused=False,
                                                                 max_dialogue_lines=30))
    shared = build_working_memory(state, "", WorkingMemoryConfig(max_context_chars=400, max_dialogue_lines=30))
    assert len(shared.dialogue) > len(fixed.dialogue)
    assert len(shared.prompt) <= 400


def test_canonical_facts_and_world_state_survive_a_tight_budget() -> None:
    state = big_state()
    wm = build_working_memory(state, "hello", WorkingMemoryConfig(max_context_chars=150))
    assert "The king is dead." in wm.prompt and "The player killed the mayor." in wm.prompt
    assert "season: autumn" in wm.prompt
    assert len(wm.canonical_facts) == 2 and len(wm.world_state) == 1


def test_overflow_keep_flags_and_keeps_mandatory() -> None:
    wm = build_working_memory(big_state(), "hello", WorkingMemoryConfig(max_context_chars=20))
    assert wm.report.over_budget
    assert wm.dialogue == () and wm.episodic == () and wm.beliefs == ()
    assert "The king is dead." in wm.prompt
    assert len(wm.prompt) == wm.report.mandatory_chars > 20


def test_overflow_raise_names_the_sizes() -> None:
    with pytest.raises(OverBudgetError, match=r"smith.*characters against max_context_chars=20"):
        build_working_memory(big_state(), "hello", WorkingMemoryConfig(max_context_chars=20, on_overflow="raise"))


def test_flags_off_make_facts_truncatable_newest_first() -> None:
    config = WorkingMemoryConfig(max_context_chars=120, always_include_canonical_facts=False,
                                 always_include_world_state=False)
    state = NpcState("smith", "Smith.", canonical_facts=[Fact(f"f{i}", "x" * 30) for i in range(5)])
    wm = build_working_memory(state, "", config)
    assert not wm.report.over_budget
    assert 0 < len(wm.canonical_facts) < 5
    assert wm.canonical_facts == state.canonical_facts[-len(wm.canonical_facts):]
    assert len(wm.prompt) <= 120


def test_one_item_larger_than_the_budget_is_dropped_and_stops_the_run() -> None:
    state = NpcState("smith", "Smith.", dialogue=[Line(1, "p", "old"), Line(2, "p", "y" * 5000), Line(3, "p", "new")])
    wm = build_working_memory(state, "", WorkingMemoryConfig(max_context_chars=300))
    assert [line.text for line in wm.dialogue] == ["new"]  # contiguous: "old" is not kept past the gap


def test_state_orders_items_by_recency_whatever_the_input_order() -> None:
    a = NpcState("n", "p", dialogue=[Line(2, "x", "b"), Line(1, "x", "a"), Line(2, "x", "c", seq=1)])
    assert [line.text for line in a.dialogue] == ["a", "b", "c"]
    assert NpcState("n", "p", dialogue=list(reversed(a.dialogue))) == a


def test_prompt_static_part_first_and_messages_carry_the_same_content() -> None:
    wm = build_working_memory(big_state(), "player: hi")
    assert wm.prompt.startswith("You are the smith.\n\n## Canonical facts\n")
    system, user = wm.messages()
    assert system["role"] == "system" and user["role"] == "user"
    # the system message is the author's part; the user message the rest, up to the cue
    assert wm.prompt.startswith(system["content"]) and "## World state" not in system["content"]
    assert user["content"].startswith("## World state\n") and user["content"].endswith("\n## Now\nplayer: hi")
    assert wm.sent_text("chat") == wm.prompt.removesuffix(f"\n{wm.agent_id}:")


def test_working_memory_round_trips_through_msgpack_and_json() -> None:
    wm = build_working_memory(big_state(), "hi", WorkingMemoryConfig(max_context_tokens=200))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(wm), type=WorkingMemory) == wm
    assert msgspec.json.decode(msgspec.json.encode(wm), type=WorkingMemory) == wm
    with pytest.raises(AttributeError):
        wm.prompt = "changed"  # type: ignore[misc]


def test_token_budget_is_met_by_the_whole_prompt() -> None:
    config = WorkingMemoryConfig(max_context_tokens=120)
    wm = build_working_memory(big_state(), "hello", config)
    assert wm.report.prompt_tokens == token_counter("cl100k")(wm.prompt) <= 120
    assert len(wm.dialogue) > 0


def test_a_state_is_rendered_once_and_stays_plain_data() -> None:
    state = big_state()
    fresh = big_state()
    build_working_memory(state, "hello", WorkingMemoryConfig(max_context_tokens=120))
    assert rendered(state) is rendered(state)
    count = token_counter("cl100k")
    assert token_sizes(state, count) is token_sizes(state, count)
    assert rendered(state) == rendered(fresh)  # the cache is what a fresh rendering gives
    assert state == fresh and msgspec.msgpack.encode(state) == msgspec.msgpack.encode(fresh)


def test_section_headers_only_for_kept_categories() -> None:
    wm = build_working_memory(NpcState("n", "p", beliefs=[Belief("b", 1, "hm")]), "")
    assert CATEGORY_HEADERS["beliefs"] in wm.prompt
    assert CATEGORY_HEADERS["dialogue"] not in wm.prompt


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_context_chars": -1}, r"max_context_chars must be a whole number >= 0, got -1"),
        ({"max_beliefs": -3}, r"max_beliefs .* got -3"),
        ({"max_context_tokens": -5}, r"max_context_tokens .* got -5"),
        ({"dialogue_share": 0.7, "episodic_share": 0.3, "belief_share": 0.2}, r"must be <= 1, got 1.2"),
        ({"belief_share": -0.1}, r"belief_share must be a number from 0 to 1, got -0.1"),
        ({"tokenizer": "gpt9"}, r"unknown tokenizer 'gpt9'"),
        ({"on_overflow": "explode"}, r"on_overflow must be 'keep' or 'raise', got 'explode'"),
    ],
)
def test_bad_config_values_are_refused_naming_field_and_value(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkingMemoryConfig(**fields)  # type: ignore[arg-type]


def test_config_decoding_reports_the_path() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"max_beliefs.*-1"):
        msgspec.json.decode(b'{"max_beliefs": -1}', type=WorkingMemoryConfig)
    with pytest.raises(msgspec.ValidationError, match=r"unknown field `max_belief`"):
        msgspec.json.decode(b'{"max_belief": 1}', type=WorkingMemoryConfig)


def _siege_state() -> NpcState:
    episodes = [Episode("siege", 0, "Watched the player hold the east gate during the siege.", 0.9)]
    episodes += [Episode(f"e{i:02}", i, f"The weather was mild on day {i}.", 0.2) for i in range(1, 40)]
    return NpcState("guard", "You are the gate guard.", episodic=episodes)


def test_scored_keeps_the_important_relevant_memory_that_recency_drops() -> None:
    state, said = _siege_state(), "player: What happened at the east gate in the siege?"
    recency = build_working_memory(state, said, WorkingMemoryConfig(max_context_chars=700))
    scored = build_working_memory(state, said, WorkingMemoryConfig(max_context_chars=700, selection="scored"))
    assert [e.id for e in recency.episodic] == ["e35", "e36", "e37", "e38", "e39"]
    assert scored.episodic[0].id == "siege" and len(scored.episodic) == 5  # rendered in time order
    assert scored.prompt.index("[tick 0]") < scored.prompt.index("[tick 39]")
    assert (recency.report.selection, scored.report.selection) == ("recency", "scored")
    # the encoding of a recency report is the seed's: the default selection is left out
    assert b"selection" not in msgspec.msgpack.encode(recency.report)
    assert b"scored" in msgspec.msgpack.encode(scored.report)
