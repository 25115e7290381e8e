"""`layout = "log"`: its invariants as properties (both selections, characters and tokens),
its prefix extension across turns, and the sections layout left byte-identical.

The profile's examples, up to 500 per property. The independent checker
(sim.checkers.log_memory) is the oracle for I1, I2, L3, L4, I6 and I8; determinism (I4),
the explanation's counts and the extension are asserted here.
"""

from __future__ import annotations

import random
from collections import Counter

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.checkers import check_working_memory
from sim.errors import ConfigError
from sim.memory import (
    Belief,
    Episode,
    Line,
    NpcState,
    WorkingMemoryConfig,
    build_working_memory,
    explain_truncation,
)
from sim.memory.render import LOG_HEADER, RECALLED_HEADER
from tests.strategies import configs, player_inputs, states

CATEGORIES = ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs")
# The profile's examples, at most 500 each: five properties of one layout, within CI's time.
examples = settings(max_examples=min(settings().max_examples, 500))


@examples
@given(states(), player_inputs, configs(layout="log", selection=None, redistribute=None))
def test_every_invariant_holds_in_characters(state: NpcState, said: str, config: WorkingMemoryConfig) -> None:
    wm = build_working_memory(state, said, config)
    assert check_working_memory(state, said, config, wm) == []


@examples
@given(states(), player_inputs, configs(layout="log", tokens=True, selection=None, redistribute=None))
def test_every_invariant_holds_in_tokens(state: NpcState, said: str, config: WorkingMemoryConfig) -> None:
    wm = build_working_memory(state, said, config)
    assert check_working_memory(state, said, config, wm) == []


@examples
@given(states(), player_inputs, configs(layout="log", selection=None), st.randoms(use_true_random=False))
def test_the_same_state_gives_the_same_bytes_whatever_its_lists_order(
    state: NpcState, said: str, config: WorkingMemoryConfig, rng: random.Random
) -> None:
    shuffled = NpcState(
        agent_id=state.agent_id, system_prompt=state.system_prompt,
        canonical_facts=tuple(rng.sample(state.canonical_facts, len(state.canonical_facts))),
        world_state=tuple(rng.sample(state.world_state, len(state.world_state))),
        episodic=tuple(rng.sample(state.episodic, len(state.episodic))),
        beliefs=tuple(rng.sample(state.beliefs, len(state.beliefs))),
        dialogue=tuple(rng.sample(state.dialogue, len(state.dialogue))),
    )
    one, two = build_working_memory(state, said, config), build_working_memory(shuffled, said, config)
    assert one.prompt == two.prompt
    assert msgspec.msgpack.encode(one) == msgspec.msgpack.encode(two)


@examples
@given(states(), player_inputs, configs(layout="log", selection=None, redistribute=None))
def test_every_drop_is_explained(state: NpcState, said: str, config: WorkingMemoryConfig) -> None:
    wm = build_working_memory(state, said, config)
    explanation = explain_truncation(state, said, config, wm)
    for name in CATEGORIES:
        row = getattr(wm.report, name)
        assert row.kept == len(getattr(wm, name))
        assert row.kept + row.dropped + row.duplicate == len(getattr(state, name))
        assert len(getattr(explanation, name).dropped) == row.dropped + row.duplicate


@examples
@given(states(), st.sampled_from(["", "player: what news?"]),
       configs(layout="log", selection="recency", redistribute=None), st.integers(min_value=0, max_value=3))
def test_a_new_line_extends_the_previous_prompt_or_moves_the_log_start_forward(
    state: NpcState, said: str, config: WorkingMemoryConfig, seq: int
) -> None:
    config = msgspec.structs.replace(config, always_include_canonical_facts=True, always_include_world_state=True)
    before = build_working_memory(state, said, config)
    newest = max((item.tick for item in (*state.dialogue, *state.episodic)), default=0)
    line = Line(tick=newest + 1, speaker="npc", text="A new line of the talk.", seq=seq)
    after = build_working_memory(msgspec.structs.replace(state, dialogue=(*state.dialogue, line)), said, config)
    if before.report.over_budget:
        return
    context = before.prompt[: before.context_chars]
    if after.prompt[: after.context_chars].startswith(context):
        return
    # else the log's head moved: what it kept before and still keeps is its newest part
    kept_before = Counter([*before.dialogue, *before.episodic])  # equal items may recur
    kept_after = Counter([*after.dialogue, *after.episodic])
    gone = kept_before - kept_after
    assert gone, "the prompt changed before the log but the log's start did not move"
    oldest_after = min((item.tick for item in kept_after), default=newest + 1)
    assert all(item.tick <= oldest_after for item in gone)


def village_turn(lines: int, first_tick: int = 3) -> NpcState:
    """An NPC that has heard `lines` lines, the first at `first_tick`, and remembers three things."""
    return NpcState(
        agent_id="smith", system_prompt="You are Brenna, the blacksmith.",
        canonical_facts=(), world_state=(),
        episodic=(Episode(id="e1", tick=0, text="Forged a sword for the player."),
                  Episode(id="e2", tick=2, text="The mayor was found dead.", significance=0.9),
                  Episode(id="e3", tick=5, text="Sold two horseshoes.")),
        beliefs=(Belief(id="b1", tick=1, text="The player is brave."),),
        dialogue=tuple(Line(tick=first_tick + n, speaker="player" if n % 2 else "smith",
                            text=f"Line number {n} of the talk.") for n in range(lines)),
    )


def test_the_log_holds_memories_and_lines_by_tick_after_the_beliefs() -> None:
    config = WorkingMemoryConfig(layout="log")
    wm = build_working_memory(village_turn(4), "player: hello", config)
    assert wm.prompt == (
        "You are Brenna, the blacksmith.\n"
        "\n## Beliefs\n- The player is brave.\n"
        f"{LOG_HEADER}"
        "- [tick 0] Forged a sword for the player.\n"
        "- [tick 2] The mayor was found dead.\n"
        "smith: Line number 0 of the talk.\n"
        "player: Line number 1 of the talk.\n"
        "- [tick 5] Sold two horseshoes.\n"  # a memory before a line of its tick
        "smith: Line number 2 of the talk.\n"
        "player: Line number 3 of the talk.\n"
        "\n## Now\nplayer: hello\nsmith:"
    )
    assert check_working_memory(village_turn(4), "player: hello", config, wm) == []


def test_successive_turns_append_to_the_log_until_its_head_moves_by_a_chunk() -> None:
    config = WorkingMemoryConfig(layout="log", max_context_chars=700)
    extended = jumps = 0
    previous = build_working_memory(village_turn(1, first_tick=6), "player: hi", config)
    for lines in range(2, 40):
        state = village_turn(lines, first_tick=6)  # each new line is the newest item
        wm = build_working_memory(state, "player: hi", config)
        assert check_working_memory(state, "player: hi", config, wm) == []
        if wm.prompt[: wm.context_chars].startswith(previous.prompt[: previous.context_chars]):
            extended += 1
        else:
            jumps += 1
            gone = {*previous.dialogue, *previous.episodic} - {*wm.dialogue, *wm.episodic}
            assert gone and max(item.tick for item in gone) <= min(item.tick for item in (*wm.dialogue, *wm.episodic))
        previous = wm
    assert extended > 2 * jumps  # most turns only append
    assert jumps >= 3  # and the head does move, in chunks


def test_a_scored_selection_lists_what_it_brings_back_from_before_the_log_last() -> None:
    config = WorkingMemoryConfig(layout="log", selection="scored", max_context_chars=520, max_dialogue_lines=4)
    state = village_turn(12)
    wm = build_working_memory(state, "player: who found the mayor dead?", config)
    assert check_working_memory(state, "player: who found the mayor dead?", config, wm) == []
    recalled = wm.prompt.split(RECALLED_HEADER)[1].split("\n## Now\n")[0]
    assert "- [tick 2] The mayor was found dead.\n" in recalled
    assert wm.prompt.index(LOG_HEADER) < wm.prompt.index(RECALLED_HEADER)


def test_the_sections_layout_is_the_default_and_unchanged() -> None:
    state = village_turn(6)
    assert build_working_memory(state, "player: hi").prompt == build_working_memory(
        state, "player: hi", WorkingMemoryConfig(layout="sections")).prompt
    assert LOG_HEADER not in build_working_memory(state, "player: hi").prompt


@pytest.mark.parametrize(("fields", "message"), [
    ({"layout": "scroll"}, "layout must be 'sections' or 'log', got 'scroll'"),
    ({"layout": "log", "stable_prefix": True}, "stable_prefix is the sections layout's"),
])
def test_a_bad_layout_is_refused_in_one_line(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as raised:
        WorkingMemoryConfig(**fields)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)
