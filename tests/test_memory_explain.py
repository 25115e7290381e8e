"""`explain_truncation`: every dropped item named with its reason, derived from the snapshot."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from sim.memory import (
    DROP_REASONS,
    Belief,
    Episode,
    Fact,
    Line,
    NpcState,
    WorkingMemory,
    WorkingMemoryConfig,
    WorldFact,
    build_working_memory,
    distinct,
    explain_truncation,
    ranking,
    render,
)
from sim.scenario import load_scenario
from tests.strategies import configs, player_inputs, states

CATEGORIES = ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs")
FLEXIBLE = ("dialogue", "episodic", "beliefs")


def _next_cost(state: NpcState, said: str, config: WorkingMemoryConfig, name: str, memory: WorkingMemory) -> int:
    """What adding the category's next candidate (the first dropped in its order: the newest, or
    the best ranked) to the prompt would cost, in characters."""
    orders = {n: getattr(state, n)[::-1] for n in CATEGORIES}
    ranks = ranking(state, said, config) if config.selection == "scored" else {}
    orders.update({n: tuple(getattr(state, n)[p] for p in rank) for n, rank in ranks.items()})
    left_out = distinct(state, memory.dialogue).duplicates  # the kept lines say them
    order = [item for item in orders[name] if name != "episodic" or item not in left_out]
    kept = len(getattr(memory, name))
    return len(render.RENDER[name](order[kept])) + (len(render.CATEGORY_HEADERS[name]) if kept == 0 else 0)


@given(states(), player_inputs, configs())
def test_dropped_counts_equal_the_report_and_every_reason_holds(state: NpcState, said: str, config) -> None:
    memory = build_working_memory(state, said, config)
    explained = explain_truncation(state, said, config, memory)
    report = memory.report
    assert explained == explain_truncation(state, said, config)  # rebuilt, the same
    for name in CATEGORIES:
        row, why = getattr(report, name), getattr(explained, name)
        assert len(why.dropped) == row.dropped + row.duplicate and why.kept == row.kept and why.used == row.used
        assert why.duplicate == row.duplicate and (row.duplicate == 0 or name == "episodic"), name
        assert {d.category for d in why.dropped} <= {name}
        assert (why.reason is None) == (row.dropped == 0)
        assert all(d.reason == why.reason for d in why.dropped[: row.dropped])
        assert all(d.reason == "duplicate" for d in why.dropped[row.dropped :])
        if why.reason == "over_budget":
            assert report.over_budget
        elif why.reason == "cap":
            assert why.cap is not None and row.kept >= why.cap
        elif why.reason == "budget":
            assert why.cap is None or row.kept < why.cap
            cost = _next_cost(state, said, config, name, memory)
            if name in FLEXIBLE and not config.redistribute_unused:
                assert row.used + cost > why.split, name  # it did not fit the category's share
            else:
                assert report.prompt_chars + cost > report.limit_chars, name  # nor anything left over
    if not report.over_budget:
        assert explained.unused_chars >= 0
        assert sum(getattr(explained, n).final for n in FLEXIBLE) <= explained.flexible_chars
        for name in FLEXIBLE:
            why = getattr(explained, name)
            assert why.used <= why.final and why.split == getattr(report, name).budget
            assert why.final - why.split == why.received - why.given
    assert [d.reason for d in explained.dropped()] == [
        d.reason for n in CATEGORIES for d in getattr(explained, n).dropped
    ]
    assert {d.reason for d in explained.dropped()} <= set(DROP_REASONS)


@given(states(max_items=8), player_inputs, configs(tokens=True))
def test_dropped_counts_equal_the_report_with_tokens(state: NpcState, said: str, config) -> None:
    memory = build_working_memory(state, said, config)
    explained = explain_truncation(state, said, config, memory)
    for name in CATEGORIES:
        row, why = getattr(memory.report, name), getattr(explained, name)
        assert len(why.dropped) == row.dropped + row.duplicate, name
        assert why.used_tokens == row.used_tokens
        if why.reason == "cap":
            assert why.cap is not None and row.kept >= why.cap
    if not memory.report.over_budget:
        assert explained.unused_tokens is not None and explained.unused_tokens >= 0


def _state() -> NpcState:
    return NpcState(
        agent_id="smith",
        system_prompt="You are a smith.",
        canonical_facts=(Fact(id="f1", text="The king is dead."),),
        world_state=(WorldFact(key="season", value="autumn"),),
        episodic=tuple(Episode(id=f"e{t}", tick=t, text=f"memory number {t}") for t in range(6)),
        beliefs=tuple(Belief(id=f"b{t}", tick=t, text=f"belief number {t}") for t in range(5)),
        dialogue=tuple(Line(tick=t, speaker="player", text=f"line {t} " + "x" * 40) for t in range(12)),
    )


def test_the_cap_is_named_when_the_count_cap_dropped_them() -> None:
    explained = explain_truncation(_state(), "hello", WorkingMemoryConfig())
    beliefs = explained.beliefs
    assert beliefs.reason == "cap" and beliefs.cap == 3 and beliefs.kept == 3
    assert [(d.tick, d.text, d.reason) for d in beliefs.dropped] == [
        (1, "belief number 1", "cap"), (0, "belief number 0", "cap"),
    ]
    assert beliefs.final == beliefs.used < beliefs.split  # it left most of its share to the others
    assert explained.dialogue.dropped[0].text.startswith("player: line 1 ")
    assert explained.canonical_facts.dropped == () and explained.canonical_facts.reason is None
    assert explained.canonical_facts.mandatory and not explained.dialogue.mandatory


def test_budget_and_over_budget_and_the_fixed_split() -> None:
    tight = explain_truncation(_state(), "hello", WorkingMemoryConfig(max_context_chars=400))
    assert [getattr(tight, n).reason for n in FLEXIBLE] == ["budget"] * 3
    assert (tight.dialogue.split, tight.dialogue.final, tight.dialogue.received) == (174, 190, 16)
    assert (tight.beliefs.split, tight.beliefs.final, tight.beliefs.given) == (43, 30, 13)
    fixed = explain_truncation(_state(), "hello", WorkingMemoryConfig(max_context_chars=400,
                                                                      redistribute_unused=False))
    assert all(getattr(fixed, n).final == getattr(fixed, n).split for n in FLEXIBLE)
    assert fixed.unused_chars == fixed.flexible_chars - sum(getattr(fixed, n).used for n in FLEXIBLE)
    over = explain_truncation(_state(), "hello", WorkingMemoryConfig(max_context_chars=20))
    assert over.over_budget and over.flexible_chars < 0 and over.unused_chars == 0
    assert {d.reason for d in over.dropped()} == {"over_budget"}
    assert len(over.dropped()) == 6 + 5 + 12
    facts_truncatable = explain_truncation(
        _state(), "hello", WorkingMemoryConfig(max_context_chars=20, always_include_canonical_facts=False))
    assert facts_truncatable.canonical_facts.dropped[0].tick is None
    assert not facts_truncatable.canonical_facts.mandatory
    assert facts_truncatable.canonical_facts.dropped[0].text == "The king is dead."


def test_the_village_snack_machine_at_the_issue_budgets() -> None:
    """The numbers that looked wrong in the view, now told: the count cap, and redistribution."""
    scenario = load_scenario("village")
    state = scenario.initial_state("innkeeper")
    for limit in (2000, 700):
        explained = explain_truncation(state, "player: What news of the king?",
                                       WorkingMemoryConfig(max_context_chars=limit))
        for name in FLEXIBLE:
            why = getattr(explained, name)
            assert why.used <= why.final, (limit, name)
    world = explain_truncation(state, "", WorkingMemoryConfig(max_context_chars=10,
                                                              always_include_world_state=False))
    assert world.world_state.dropped[0].text == "season: late autumn"  # newest by key, as data


@given(states(), player_inputs, configs())
def test_the_kept_items_are_the_working_memorys(state: NpcState, said: str, config) -> None:
    memory = build_working_memory(state, said, config)
    explained = explain_truncation(state, said, config, memory)
    assert explained.dialogue.kept_items == tuple(f"{x.speaker}: {x.text}" for x in reversed(memory.dialogue))
    assert explained.world_state.kept_items == tuple(f"{w.key}: {w.value}" for w in reversed(memory.world_state))
    for name in ("canonical_facts", "episodic", "beliefs"):
        assert getattr(explained, name).kept_items == tuple(x.text for x in reversed(getattr(memory, name)))


@given(states(), player_inputs, configs(), st.integers(min_value=0, max_value=6))
def test_most_dropped_names_the_newest_dropped_and_changes_nothing_else(
    state: NpcState, said: str, config: WorkingMemoryConfig, most: int
) -> None:
    """What a trace carries (sim.wire.trace): the first `most` of each category's dropped
    items, newest first, and every other field as the full explanation has it."""
    full = explain_truncation(state, said, config)
    bounded = explain_truncation(state, said, config, most_dropped=most)
    names = ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs")
    for name in names:
        whole, part = getattr(full, name), getattr(bounded, name)
        assert part.dropped == whole.dropped[:most]
        assert msgspec.structs.replace(part, dropped=()) == msgspec.structs.replace(whole, dropped=())
    assert msgspec.structs.replace(bounded, **{name: getattr(full, name) for name in names}) == full
