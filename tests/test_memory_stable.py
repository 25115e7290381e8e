"""`stable_prefix`: the start of a category's kept run moves only in steps (sim.memory._stable).

The invariants with it on (docs/working-memory.md, "Stable prefix"): mandatory content always
there and within budget (the checker, tests/test_memory_properties.py, draws it too); the
newest item of a category kept whenever the ordinary selection keeps it; only items the
ordinary selection kept are given up (a line with the memory it said: dropped, no longer a
duplicate), and the report counts their characters; deterministic,
and the same whatever the state's window holds before the ordinary start; appending the
newest line of dialogue extends the dialogue's kept text or moves its start forward.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.checkers import check_working_memory
from sim.errors import ConfigError
from sim.memory import (
    Episode,
    Line,
    NpcState,
    ScoredSelection,
    WorkingMemory,
    WorkingMemoryConfig,
    build_working_memory,
    explain_truncation,
    prefix_reuse,
)
from tests.strategies import configs, player_inputs, states

FLEXIBLE = ("dialogue", "episodic", "beliefs")


def _stable(config: WorkingMemoryConfig) -> WorkingMemoryConfig:
    return msgspec.structs.replace(config, stable_prefix=True)


def _talk(lines: int, memories: int = 0) -> NpcState:
    """An NPC with a long conversation behind it (and memories)."""
    return NpcState(
        agent_id="smith",
        system_prompt="You are the smith.",
        dialogue=tuple(Line(tick=t, speaker="player" if t % 2 else "smith", text=f"line {t} about the gate")
                       for t in range(lines)),
        episodic=tuple(Episode(id=f"m{t}", tick=t, text=f"memory {t} of the siege") for t in range(memories)),
    )


def test_a_bad_value_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^stable_prefix must be true or false, got 'yes'$"):
        WorkingMemoryConfig(stable_prefix="yes")  # type: ignore[arg-type]


def test_off_by_default_and_the_default_encoding_of_the_report_is_unchanged() -> None:
    wm = build_working_memory(_talk(40), "hello", WorkingMemoryConfig(max_context_chars=400))
    assert WorkingMemoryConfig().stable_prefix is False
    assert wm.report.stable_cost_chars == 0
    assert b"stable_cost_chars" not in msgspec.json.encode(wm.report)


def test_the_start_moves_to_an_anchor_and_the_report_counts_what_it_cost() -> None:
    state, config = _talk(40), WorkingMemoryConfig(max_context_chars=420)
    ordinary = build_working_memory(state, "hello", config)
    stable = build_working_memory(state, "hello", _stable(config))
    assert stable.dialogue[-1] == state.dialogue[-1]  # the newest is kept
    assert set(stable.dialogue) <= set(ordinary.dialogue)
    assert len(ordinary.dialogue) > len(stable.dialogue)  # this state's anchors do move the start
    assert stable.report.stable_cost_chars == len(ordinary.prompt) - len(stable.prompt) > 0
    row = stable.report.dialogue
    assert row.kept + row.dropped == len(state.dialogue) and row.kept == len(stable.dialogue)
    assert check_working_memory(state, "hello", _stable(config), stable) == []  # it starts at an anchor


def test_successive_turns_append_until_the_start_steps_forward() -> None:
    """One line more per turn at the same budget: the dialogue's kept text grows at its end,
    and its start moves only at a few turns, several lines at once; without it, every turn."""
    config = WorkingMemoryConfig(max_context_chars=420)
    steps = {False: 0, True: 0}
    for stable in (False, True):
        cfg = msgspec.structs.replace(config, stable_prefix=stable)
        previous: WorkingMemory | None = None
        for turn in range(20, 60):
            wm = build_working_memory(_talk(turn), "hello", cfg)
            if previous is not None:
                before, after = previous.dialogue, wm.dialogue
                if after[: len(before)] == before:
                    assert wm.prompt[: wm.context_chars].startswith(previous.prompt[: previous.context_chars])
                else:
                    assert after[0].tick > before[0].tick
                    steps[stable] += 1
            previous = wm
    assert steps[False] == 39
    assert 0 < steps[True] < 20


def test_the_scored_selection_moves_its_start_in_steps_too() -> None:
    state = _talk(40, memories=30)
    config = WorkingMemoryConfig(max_context_chars=600, selection="scored",
                                 scored=ScoredSelection(importance_weight=0.0))
    stable = build_working_memory(state, "the gate", _stable(config))
    ordinary = build_working_memory(state, "the gate", config)
    assert stable.report.selection == "scored"
    for name in FLEXIBLE:
        kept, before = getattr(stable, name), getattr(ordinary, name)
        assert set(kept) <= set(before)
        assert not kept or (kept[0] in before and {k for k in before if k not in kept} == {
            k for k in before if (k.tick, getattr(k, "seq", 0)) < (kept[0].tick, getattr(kept[0], "seq", 0))})
    assert check_working_memory(state, "the gate", _stable(config), stable) == []


def test_a_token_count_over_the_limit_after_the_step_keeps_the_ordinary_selection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tokens merge across items: should the stable prompt count more than the limit, the
    build keeps the ordinary one. A counter that charges the stable prompt's first line
    right after the header stands in for such a merge."""
    state, config = _talk(40), WorkingMemoryConfig(max_context_chars=5000, max_context_tokens=430)
    stable_first = build_working_memory(state, "hello", _stable(config)).dialogue[0]
    joined = f"\n## Recent dialogue\n{stable_first.speaker}: {stable_first.text}"

    def count(text: str) -> int:
        return len(text) + (10_000 if joined in text else 0)

    # the builder's own counter, replaced by its module path: no public seam takes a counter
    monkeypatch.setattr("sim.memory._build.token_counter", lambda name: count)
    ordinary = build_working_memory(state, "hello", config)
    fallen_back = build_working_memory(state, "hello", _stable(config))
    assert fallen_back == ordinary  # its kept items and report too, not only its prompt
    assert fallen_back.report.stable_cost_chars == 0
    assert fallen_back.report.prompt_tokens == ordinary.report.prompt_tokens <= 430


def test_the_explanation_names_what_stability_gave_up() -> None:
    state, config = _talk(40), _stable(WorkingMemoryConfig(max_context_chars=420))
    wm = build_working_memory(state, "hello", config)
    explained = explain_truncation(state, "hello", config, wm).dialogue
    given_up = [d for d in explained.dropped if d.reason == "stable_prefix"]
    unstable = msgspec.structs.replace(config, stable_prefix=False)
    ordinary = build_working_memory(state, "hello", unstable)
    assert explained.reason == "stable_prefix"
    assert len(given_up) == len(ordinary.dialogue) - len(wm.dialogue) > 0
    assert explained.dropped[: len(given_up)] == tuple(given_up)  # first, newest first
    assert given_up[0].tick == wm.dialogue[0].tick - 1
    truncated = explain_truncation(state, "hello", unstable, ordinary).dialogue.reason
    assert {d.reason for d in explained.dropped[len(given_up):]} == {truncated} == {"cap"}
    assert len(explained.dropped) == wm.report.dialogue.dropped
    few = explain_truncation(state, "hello", config, wm, most_dropped=1).dialogue
    assert [d.reason for d in few.dropped] == ["stable_prefix"]


def test_a_line_given_up_takes_the_memory_it_said_with_it() -> None:
    """Each line has its memory: the ordinary selection says the lines' events by the lines; the
    stable start gives up the oldest five, and their memories go with them (reason
    `stable_prefix`), never left as duplicates of lines the prompt no longer holds."""
    talk = _talk(40)
    state = msgspec.structs.replace(
        talk, dialogue=tuple(msgspec.structs.replace(line, event=f"ev{line.tick}") for line in talk.dialogue),
        episodic=tuple(Episode(id=f"m{t}", tick=t, text=f"heard line {t}", event=f"ev{t}") for t in range(40)))
    config = _stable(WorkingMemoryConfig(max_context_chars=420))
    wm = build_working_memory(state, "hello", config)
    ordinary = build_working_memory(state, "hello", msgspec.structs.replace(config, stable_prefix=False))
    assert [line.tick for line in ordinary.dialogue] == list(range(30, 40))
    assert [line.tick for line in wm.dialogue] == list(range(35, 40))
    assert ordinary.report.episodic.duplicate == 10 and wm.report.episodic.duplicate == 5
    assert wm.episodic == ordinary.episodic and wm.report.episodic.dropped == ordinary.report.episodic.dropped + 5
    explained = explain_truncation(state, "hello", config, wm).episodic
    assert [(d.tick, d.reason) for d in explained.dropped[:6]] == [
        (34, "stable_prefix"), (33, "stable_prefix"), (32, "stable_prefix"), (31, "stable_prefix"),
        (30, "stable_prefix"), (28, "budget")]
    assert check_working_memory(state, "hello", config, wm) == []


def test_a_memory_a_kept_line_says_is_never_the_memories_anchor() -> None:
    """The memory of the greeting lies between the kept memories, and its id makes it an
    anchor; it is no candidate (the kept line says it), so the stable start passes over it
    to the next anchor, the newest memory."""
    state = NpcState("smith", "You are the smith.", episodic=(
        Episode(id="0", tick=0, text="Mended a net."),
        Episode(id="000", tick=0, text='player said to me: "Hello."', event="hi"),
        Episode(id="0", tick=1, text="Rain."),
        Episode(id="1", tick=1, text="Sun."),
    ), dialogue=(Line(tick=0, speaker="player", text="Hello.", event="hi"),))
    config = WorkingMemoryConfig(max_dialogue_lines=1, max_episodic_memories=3, stable_prefix=True)
    wm = build_working_memory(state, "", config)
    ordinary = build_working_memory(state, "", msgspec.structs.replace(config, stable_prefix=False))
    assert [e.text for e in ordinary.episodic] == ["Mended a net.", "Rain.", "Sun."]
    assert [e.text for e in wm.episodic] == ["Sun."]
    assert check_working_memory(state, "", config, wm) == []


def test_prefix_reuse_in_characters_and_tokens() -> None:
    chars = prefix_reuse("abcdef", "abcxyz", WorkingMemoryConfig())
    assert (chars.chars, chars.prompt_chars, chars.tokens, chars.share) == (3, 6, None, 0.5)
    assert prefix_reuse("", "", WorkingMemoryConfig()).share == 0.0
    tokens = prefix_reuse("the smith said hello", "the smith said goodbye",
                          WorkingMemoryConfig(max_context_tokens=100))
    assert tokens.chars == len("the smith said ")
    # The shared text's tokens: "the", " smith", " said", " " (a server reuses the first three,
    # since the prompt's own tokens go on with " goodbye").
    assert tokens.tokens == 4 and tokens.prompt_tokens == 4


# --- properties ---------------------------------------------------------------------------


def _both(state: NpcState, said: str, config: WorkingMemoryConfig) -> tuple[WorkingMemory, WorkingMemory]:
    ordinary = build_working_memory(state, said, msgspec.structs.replace(config, stable_prefix=False))
    return ordinary, build_working_memory(state, said, _stable(config))


@given(states(), player_inputs, configs(stable=True))
def test_sound_and_within_budget(state: NpcState, said: str, config: WorkingMemoryConfig) -> None:
    assert check_working_memory(state, said, config, build_working_memory(state, said, config)) == []


@given(states(max_items=8), player_inputs, configs(tokens=True, stable=True))
def test_sound_and_within_budget_in_tokens(state: NpcState, said: str, config: WorkingMemoryConfig) -> None:
    assert check_working_memory(state, said, config, build_working_memory(state, said, config)) == []


@given(states(), player_inputs, configs())
def test_gives_up_only_what_the_ordinary_selection_kept_and_never_the_newest(
    state: NpcState, said: str, config: WorkingMemoryConfig
) -> None:
    ordinary, stable = _both(state, said, config)
    for name in ("canonical_facts", "world_state"):
        assert getattr(stable, name) == getattr(ordinary, name)
    for name in FLEXIBLE:
        before, kept = getattr(ordinary, name), getattr(stable, name)
        assert set(kept) <= set(before), name
        if before:
            assert kept and kept[-1] == before[-1], name
        row, before_row = getattr(stable.report, name), getattr(ordinary.report, name)
        assert row.kept == len(kept)
        assert row.kept + row.dropped + row.duplicate == before_row.kept + before_row.dropped + before_row.duplicate
    # a memory whose line stability gave up goes with it: dropped, no longer a duplicate
    assert stable.report.episodic.duplicate <= ordinary.report.episodic.duplicate
    assert stable.report.stable_cost_chars == len(ordinary.prompt) - len(stable.prompt) >= 0


def _after(state: NpcState, wm: WorkingMemory) -> NpcState:
    """The state without its flexible items older than what `wm` says of each category (of
    the memories, the oldest it says is the oldest it keeps or a kept line says: a memory a
    line carries took part in the choice, it may have been kept before the line was)."""
    fields = {}
    said = {line.event for line in wm.dialogue} - {None}
    for name in FLEXIBLE:
        kept, items = getattr(wm, name), getattr(state, name)
        starts = [items.index(kept[0])] if kept else []
        if name == "episodic":
            starts += [p for p, e in enumerate(items) if e.event in said][:1]
        fields[name] = items[min(starts, default=0):]
    return msgspec.structs.replace(state, **fields)


@given(states(), player_inputs, configs(selection="recency"))
def test_the_window_before_the_ordinary_start_changes_nothing(
    state: NpcState, said: str, config: WorkingMemoryConfig
) -> None:
    ordinary, stable = _both(state, said, config)
    assert build_working_memory(_after(state, ordinary), said, _stable(config)).prompt == stable.prompt
    assert build_working_memory(state, said, _stable(config)) == stable


_no_events = states().map(lambda s: msgspec.structs.replace(
    s, dialogue=tuple(msgspec.structs.replace(line, event=None) for line in s.dialogue)))


@given(_no_events, player_inputs, configs(selection="recency"), st.text(max_size=80))
def test_a_newer_line_extends_the_dialogue_or_steps_its_start_forward(
    state: NpcState, said: str, config: WorkingMemoryConfig, text: str
) -> None:
    config = _stable(config)
    newest = max((line.tick for line in state.dialogue), default=0) + 1
    longer = msgspec.structs.replace(state, dialogue=(*state.dialogue, Line(tick=newest, speaker="player", text=text)))
    before, after = build_working_memory(state, said, config), build_working_memory(longer, said, config)
    if not before.dialogue or not after.dialogue:
        return
    if after.dialogue[: len(before.dialogue)] == before.dialogue:
        if all(getattr(after, n) == getattr(before, n) for n in ("canonical_facts", "world_state", "episodic",
                                                                 "beliefs")):
            assert after.prompt[: after.context_chars].startswith(before.prompt[: before.context_chars])
    else:  # positions, not items: a state may hold equal lines
        assert len(longer.dialogue) - len(after.dialogue) > len(state.dialogue) - len(before.dialogue)
