"""Nothing said twice in one prompt: a memory whose line the dialogue keeps is left out
(reason `duplicate`), and only it: the memory of a line the budget or the cap drops is a
candidate like any other. The line answered is only the input, and the checker catches a
builder that says something twice (I8)."""

from __future__ import annotations

import msgspec
import pytest

from sim.checkers import check_working_memory
from sim.errors import ScenarioError
from sim.memory import (
    Episode,
    Line,
    NpcState,
    ScoredSelection,
    WorkingMemoryConfig,
    build_working_memory,
    distinct,
    explain_truncation,
    leave_out_event,
)
from sim.scenario import parse_scenario

QUESTION = "What news of the king?"


def _state() -> NpcState:
    """The innkeeper at tick 12 of the village: the player's question at tick 11 is a
    memory and a line; a notice and an older line have no line of their own."""
    return NpcState(
        agent_id="innkeeper",
        system_prompt="You are Tobin.",
        episodic=(
            Episode(id="e1", tick=0, text="Hid the children in the cellar."),
            Episode(id="ev:a", tick=5, text='guard_captain said to me: "Ale."', event="a"),
            Episode(id="ev:n", tick=9, text="The bell rang.", event="n"),
            Episode(id="ev:q", tick=11, text=f'player said to me: "{QUESTION}"', event="q"),
        ),
        dialogue=(
            Line(tick=6, speaker="guard_captain", text="Ale.", event="a"),
            Line(tick=6, speaker="innkeeper", text="Coming up.", seq=1, event="r"),
            Line(tick=12, speaker="player", text=QUESTION, seq=1, event="q"),
        ),
    )


def test_a_memory_whose_line_is_kept_is_left_out_as_a_duplicate() -> None:
    state, config = _state(), WorkingMemoryConfig()
    memory = build_working_memory(state, "hello", config)
    assert [e.id for e in memory.episodic] == ["e1", "ev:n"]
    assert memory.prompt.count(QUESTION) == 1 and memory.prompt.count("Ale.") == 1
    assert (memory.report.episodic.kept, memory.report.episodic.dropped, memory.report.episodic.duplicate) == (2, 0, 2)
    explained = explain_truncation(state, "hello", config, memory)
    assert [(d.tick, d.reason) for d in explained.episodic.dropped] == [(11, "duplicate"), (5, "duplicate")]
    assert explained.episodic.reason is None and explained.episodic.duplicate == 2
    assert check_working_memory(state, "hello", config, memory) == []


def test_a_line_past_the_dialogue_cap_leaves_its_memory_in() -> None:
    state = _state()
    config = WorkingMemoryConfig(max_dialogue_lines=1)  # only the question can be kept
    memory = build_working_memory(state, "hello", config)
    assert [e.id for e in memory.episodic] == ["e1", "ev:a", "ev:n"]
    assert [line.event for line in memory.dialogue] == ["q"]
    assert distinct(state, memory.dialogue).duplicates == (state.episodic[-1],)
    assert distinct(state, ()).state is state  # no line kept: nothing is a duplicate
    assert check_working_memory(state, "hello", config, memory) == []


def test_a_line_the_budget_drops_leaves_its_memory_in_when_it_fits() -> None:
    """The captain's line is one of the ten the dialogue may keep, but the budget holds only
    the newest two lines: the memory of the captain's order is said, among the memories,
    instead of neither."""
    state = msgspec.structs.replace(_state(), dialogue=(
        Line(tick=6, speaker="guard_captain", text="Ale, and be quick about it, the whole garrison is thirsty.",
             event="a"),
        *_state().dialogue[1:],
    ))
    config = WorkingMemoryConfig(max_context_chars=200)
    memory = build_working_memory(state, "hello", config)
    assert [line.event for line in memory.dialogue] == ["r", "q"]  # the captain's line did not fit
    assert [e.id for e in memory.episodic] == ["ev:a", "ev:n"]  # its memory did
    assert "Ale." in memory.prompt and memory.prompt.count(QUESTION) == 1
    row = memory.report.episodic
    assert (row.kept, row.dropped, row.duplicate) == (2, 1, 1)  # e1 did not fit; the question is the line's
    explained = explain_truncation(state, "hello", config, memory)
    assert [(d.tick, d.reason) for d in explained.episodic.dropped] == [(0, "budget"), (11, "duplicate")]
    assert check_working_memory(state, "hello", config, memory) == []


def test_a_scored_selection_s_candidate_lines_are_the_top_of_its_ranking() -> None:
    """Scored may keep an old line the input is about: its memory is then the duplicate, while
    the memory of a newer line the ranking passes over is a candidate again."""
    state = _state()
    config = WorkingMemoryConfig(max_dialogue_lines=1, selection="scored",
                                 scored=ScoredSelection(recency_weight=0.0, importance_weight=0.0))
    memory = build_working_memory(state, "guard_captain: ale?", config)
    assert [line.event for line in memory.dialogue] == ["a"]  # the old line, not the newest
    assert [e.id for e in memory.episodic] == ["e1", "ev:n", "ev:q"]
    assert memory.report.episodic.duplicate == 1
    explained = explain_truncation(state, "guard_captain: ale?", config, memory)
    assert [(d.tick, d.reason) for d in explained.episodic.dropped] == [(5, "duplicate")]
    assert check_working_memory(state, "guard_captain: ale?", config, memory) == []


def test_the_line_answered_is_only_the_input() -> None:
    said = f"player: {QUESTION}"
    state = leave_out_event(_state(), "q")
    assert all(item.event != "q" for item in (*state.episodic, *state.dialogue))
    assert leave_out_event(state, "q") is state  # nothing more to leave out
    memory = build_working_memory(state, said, WorkingMemoryConfig())
    assert memory.prompt.count(QUESTION) == 1
    assert memory.prompt.endswith(f"## Now\n{said}\ninnkeeper:")


def test_a_trace_names_the_first_dropped_items_duplicates_included() -> None:
    state = _state()
    config = WorkingMemoryConfig(max_episodic_memories=1)  # e1 goes for the cap
    full = explain_truncation(state, "hello", config)
    assert [d.reason for d in full.episodic.dropped] == ["cap", "duplicate", "duplicate"]
    for most in range(5):
        assert explain_truncation(state, "hello", config, most_dropped=most).episodic.dropped == \
            full.episodic.dropped[:most]


def test_the_checker_catches_a_memory_said_again() -> None:
    """A builder that ignores the events keeps the memory of a kept line: I3 and I8."""
    state, config = _state(), WorkingMemoryConfig()
    blind = NpcState(state.agent_id, state.system_prompt, episodic=state.episodic,
                     dialogue=[msgspec.structs.replace(line, event=None) for line in state.dialogue])
    said_twice = msgspec.structs.replace(build_working_memory(blind, "hello", config), dialogue=state.dialogue)
    found = {v.invariant for v in check_working_memory(state, "hello", config, said_twice)}
    assert found == {"I3", "I8"}


def test_a_scenario_names_the_event_of_a_memory_and_its_line() -> None:
    npc = """
[scenario]
name = "inn"
[[locations]]
id = "inn"
name = "Inn"
[[npcs]]
id = "innkeeper"
name = "Tobin"
location = "inn"
system_prompt = "You are Tobin."
episodic = [{ id = "e1", tick = 2, text = "The captain asked for ale.", event = "ale" }]
dialogue = [{ tick = 2, speaker = "guard_captain", text = "Ale.", event = "ale" }]
"""
    scenario = parse_scenario(npc, source="s.toml")
    memory = build_working_memory(scenario.initial_state("innkeeper"), "hello", scenario.memory)
    assert "asked for ale" not in memory.prompt and "guard_captain: Ale." in memory.prompt
    with pytest.raises(ScenarioError, match=r"^s\.toml:.*event"):
        parse_scenario(npc.replace('event = "ale" }]\ndialogue', 'event = "" }]\ndialogue'), source="s.toml")
