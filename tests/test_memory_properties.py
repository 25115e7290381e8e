"""Property tests of the working-memory invariants I1-I8 on random states, for both selections.

The independent checker (sim.checkers) is the oracle for I1, I2, I3, I6 and I8; I4, I5 and
I7 are asserted here directly, and I8 once more on the kept items and the explanation. The
configs drawn use either selection ("recency" or "scored"), unless a test names one, and
for I1-I4, I6 and I8 either value of `stable_prefix` (tests/test_memory_stable.py has its
own invariants).
The CI profile runs 2,000 examples per invariant.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from sim.checkers import check_working_memory
from sim.memory import (
    Episode,
    NpcState,
    ScoredSelection,
    WorkingMemory,
    WorkingMemoryConfig,
    build_working_memory,
    distinct,
    explain_truncation,
    ranking,
)
from tests.strategies import configs, player_inputs, states, unit

REPO = Path(__file__).resolve().parent.parent
CATEGORIES = ("canonical_facts", "world_state", "dialogue", "episodic", "beliefs")
FLEXIBLE = ("dialogue", "episodic", "beliefs")


def violations(state: NpcState, said: str, config: WorkingMemoryConfig, invariant: str) -> list[str]:
    wm = build_working_memory(state, said, config)
    return [v.detail for v in check_working_memory(state, said, config, wm) if v.invariant == invariant]


@given(states(), player_inputs, configs(stable=None))
def test_i1_canonical_facts_and_world_state_always_present(state: NpcState, said: str, config) -> None:
    assert violations(state, said, config, "I1") == []


@given(states(), player_inputs, configs(stable=None))
def test_i2_prompt_within_budget_unless_flagged(state: NpcState, said: str, config) -> None:
    assert violations(state, said, config, "I2") == []


@given(states(), player_inputs, configs(stable=None))
def test_i3_first_of_the_order_within_caps(state: NpcState, said: str, config) -> None:
    assert violations(state, said, config, "I3") == []


@given(states(), player_inputs, configs(redistribute=True, stable=None))
def test_i6_maximal_with_redistribution(state: NpcState, said: str, config) -> None:
    assert violations(state, said, config, "I6") == []


@given(states(), player_inputs, configs(stable=None))
def test_i8_nothing_said_twice(state: NpcState, said: str, config) -> None:
    assert violations(state, said, config, "I8") == []
    wm = build_working_memory(state, said, config)
    # by the events, apart from the checker: no kept memory's event is a kept line's...
    said_by_lines = {line.event for line in wm.dialogue} - {None}
    assert not any(e.event in said_by_lines for e in wm.episodic)
    # ...the duplicates are the memories of the kept lines, and only they...
    of_kept_lines = sorted((e.tick, e.text) for e in state.episodic if e.event in said_by_lines)
    explained = explain_truncation(state, said, config, wm).episodic.dropped
    assert sorted((d.tick, d.text) for d in explained if d.reason == "duplicate") == of_kept_lines
    row = wm.report.episodic
    assert row.duplicate == len(of_kept_lines)
    # ...and every memory is kept, dropped or a duplicate
    assert row.kept + row.dropped + row.duplicate == len(state.episodic)
    # deterministic: a copy of the state (no cache shared) gives the same bytes
    copy = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=NpcState)
    assert msgspec.msgpack.encode(build_working_memory(copy, said, config)) == msgspec.msgpack.encode(wm)


@given(states(max_items=8), player_inputs, configs(tokens=True, stable=None))
def test_i8_with_tokens(state: NpcState, said: str, config) -> None:
    """The exact token fit drops and offers lines: what they say follows them."""
    wm = build_working_memory(state, said, config)
    said_by_lines = {line.event for line in wm.dialogue} - {None}
    assert not any(e.event in said_by_lines for e in wm.episodic)
    row = wm.report.episodic
    assert row.duplicate == sum(e.event in said_by_lines for e in state.episodic)
    assert row.kept + row.dropped + row.duplicate == len(state.episodic)


@given(states(max_items=8), player_inputs, configs(tokens=True, stable=None))
def test_token_budget_i1_i2_i3_i6_i8(state: NpcState, said: str, config) -> None:
    wm = build_working_memory(state, said, config)
    assert check_working_memory(state, said, config, wm) == []


def _shuffled(state: NpcState, rng: random.Random) -> NpcState:
    fields = {}
    for name in CATEGORIES:
        items = list(getattr(state, name))
        rng.shuffle(items)
        fields[name] = items
    return NpcState(state.agent_id, state.system_prompt, **fields)


@given(states(), player_inputs, configs(stable=None), st.randoms(use_true_random=False))
def test_i4_deterministic_whatever_the_input_order(state: NpcState, said: str, config, rng: random.Random) -> None:
    first = build_working_memory(state, said, config)
    again = build_working_memory(_shuffled(state, rng), said, config)
    assert msgspec.msgpack.encode(first) == msgspec.msgpack.encode(again)
    assert first.prompt == again.prompt


def test_i4_deterministic_across_hash_seeds() -> None:
    """Same bytes from fresh interpreters with different PYTHONHASHSEED."""
    code = (
        "import hashlib, msgspec\n"
        "from sim.scenario import load_scenario\n"
        "from sim.memory import build_working_memory, WorkingMemoryConfig\n"
        "s = load_scenario('scenarios/village.toml')\n"
        "h = hashlib.sha256()\n"
        "for n in s.npcs:\n"
        "    for c in (WorkingMemoryConfig(), WorkingMemoryConfig(max_context_chars=600),\n"
        "              WorkingMemoryConfig(max_context_chars=600, selection='scored')):\n"
        "        h.update(msgspec.msgpack.encode(build_working_memory(s.initial_state(n.id), 'hi', c)))\n"
        "print(h.hexdigest())\n"
    )
    digests = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             timeout=60, cwd=REPO)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def _said(state: NpcState, wm: WorkingMemory) -> dict[str, set[object]]:
    """What the prompt says of each flexible category: its kept items, and for the memories
    also those a kept line says (the line says the memory's event)."""
    said: dict[str, set[object]] = {name: set(getattr(wm, name)) for name in FLEXIBLE}
    said["episodic"] |= set(distinct(state, wm.dialogue).duplicates)
    return said


@given(states(), player_inputs, configs(redistribute=False), st.integers(0, 3000), st.integers(0, 3000))
def test_i5_fixed_split_monotonic(state: NpcState, said: str, config, a: int, b: int) -> None:
    """A higher limit drops nothing the prompt says: a memory it no longer keeps is said by
    a line it now keeps."""
    low, high = sorted((a, b))
    at_low = build_working_memory(state, said, msgspec.structs.replace(config, max_context_chars=low))
    at_high = _said(state, build_working_memory(state, said, msgspec.structs.replace(config, max_context_chars=high)))
    for name, items in _said(state, at_low).items():
        assert items <= at_high[name], name


@given(states(), player_inputs, configs(redistribute=True), st.integers(0, 3000), st.integers(0, 3000))
def test_i5_redistribution_contains_fixed_split_at_any_lower_limit(
    state: NpcState, said: str, config, a: int, b: int
) -> None:
    low, high = sorted((a, b))
    fixed = msgspec.structs.replace(config, redistribute_unused=False)
    redistributed = _said(state, build_working_memory(state, said,
                                                      msgspec.structs.replace(config, max_context_chars=high)))
    for limit in (low, high):
        at_limit = build_working_memory(state, said, msgspec.structs.replace(fixed, max_context_chars=limit))
        for name, items in _said(state, at_limit).items():
            assert items <= redistributed[name], (name, limit)


def _seed_reference(state: NpcState, said: str, config: WorkingMemoryConfig) -> dict[str, int]:
    """The seed article's fixed split, written out plainly: counts kept per category; the
    dialogue first, then the memories its kept lines do not say."""
    from sim.memory.render import CATEGORY_HEADERS, render_belief, render_episode, render_line

    mandatory_only = build_working_memory(
        NpcState(state.agent_id, state.system_prompt, state.canonical_facts, state.world_state), said, config
    )
    remaining = config.max_context_chars - len(mandatory_only.prompt)
    if remaining < 0:
        return {name: 0 for name in FLEXIBLE}
    plan = {
        "dialogue": (remaining * config.dialogue_share, render_line, config.max_dialogue_lines),
        "episodic": (remaining * config.episodic_share, render_episode, config.max_episodic_memories),
        "beliefs": (remaining * config.belief_share, render_belief, config.max_beliefs),
    }
    kept = {}
    for name, (share, render, cap) in plan.items():
        items = getattr(state, name)
        if name == "episodic":
            lines = state.dialogue[len(state.dialogue) - kept["dialogue"] :]
            items = [e for e in items if e.event is None or e.event not in {line.event for line in lines}]
        budget = int(share)
        used = 0
        count = 0
        for item in reversed(items):
            size = len(render(item)) + (len(CATEGORY_HEADERS[name]) if count == 0 else 0)
            if count >= cap or used + size > budget:
                break
            used += size
            count += 1
        kept[name] = count
    return kept


@given(states(), player_inputs, configs(redistribute=False, selection="recency"))
def test_i7_seed_split_reproduced_without_redistribution(state: NpcState, said: str, config) -> None:
    config = msgspec.structs.replace(config, always_include_canonical_facts=True, always_include_world_state=True)
    wm = build_working_memory(state, said, config)
    assert {name: getattr(wm.report, name).kept for name in FLEXIBLE} == _seed_reference(state, said, config)


@given(states(), player_inputs, configs(selection="scored"))
def test_scored_keeps_the_top_of_its_ranking_in_time_order(state: NpcState, said: str, config) -> None:
    """I3 restated, on its own: the kept items are the first of the ranking, rendered oldest
    first; a memory that a kept line says is passed over."""
    wm = build_working_memory(state, said, config)
    ranks = ranking(state, said, config)
    left_out = distinct(state, wm.dialogue).duplicates
    for name in FLEXIBLE:
        rank, kept = ranks[name], getattr(wm, name)
        items = getattr(state, name)
        assert sorted(rank) == list(range(len(items)))  # a permutation of the items
        chosen = [p for p in rank if name != "episodic" or items[p] not in left_out]
        assert kept == tuple(items[p] for p in sorted(chosen[: len(kept)])), name


def _of_one_importance(state: NpcState, importance: float) -> NpcState:
    """`state` with every memory's significance and every belief's confidence `importance`."""
    return NpcState(state.agent_id, state.system_prompt, state.canonical_facts, state.world_state,
                    episodic=[msgspec.structs.replace(e, significance=importance) for e in state.episodic],
                    beliefs=[msgspec.structs.replace(b, confidence=importance) for b in state.beliefs],
                    dialogue=state.dialogue)


@given(states(), player_inputs, configs(selection="scored"), unit)
def test_scored_with_recency_alone_is_the_recency_selection(state: NpcState, said: str, config,
                                                             importance: float) -> None:
    """Weights (w, 0, 0) and items of one importance: the ranking is newest first (ties go to
    the newer), so the prompt is recency's."""
    state = _of_one_importance(state, importance)
    recency_alone = ScoredSelection(recency_weight=max(config.scored.recency_weight, 0.5), importance_weight=0.0,
                                    relevance_weight=0.0, half_life_ticks=config.scored.half_life_ticks,
                                    dialogue_importance=config.scored.dialogue_importance)
    only_recency = msgspec.structs.replace(config, scored=recency_alone)
    scored = build_working_memory(state, said, only_recency)
    recency = build_working_memory(state, said, msgspec.structs.replace(only_recency, selection="recency"))
    assert scored.prompt == recency.prompt
    assert scored.report.selection == "scored" and recency.report.selection == "recency"


@given(states(), player_inputs, configs(selection="scored"), st.integers(0, 30))
def test_a_ranking_cut_at_a_limit_is_the_top_of_the_whole_ranking(
    state: NpcState, said: str, config, limit: int
) -> None:
    """The builder ranks only up to each cap; the explanation and the checker rank everything."""
    whole = ranking(state, said, config)
    cut = ranking(state, said, config, limits=dict.fromkeys(FLEXIBLE, limit))
    again = ranking(state, said, config)  # the per-input memory changes nothing
    assert whole == again
    for name in FLEXIBLE:
        assert cut[name] == whole[name][:limit], name


_RECENCY_ALONE = WorkingMemoryConfig(selection="scored", scored=ScoredSelection(importance_weight=0.0,
                                                                              relevance_weight=0.0))


def _memories_ranked(ticks_and_significance: list[tuple[int, float]], half_life: float) -> list[int]:
    """The memories' ranking by recency alone (weights (1, 0, 0)), as the indexes of the list
    given (ids in its order, so an index later in it at the same tick is the newer)."""
    state = NpcState("smith", "You are a smith.", episodic=[
        Episode(id=f"m{i:02d}", tick=tick, text="The bell rang.", significance=significance)
        for i, (tick, significance) in enumerate(ticks_and_significance)
    ])
    config = msgspec.structs.replace(_RECENCY_ALONE, scored=msgspec.structs.replace(_RECENCY_ALONE.scored,
                                                                                    half_life_ticks=half_life))
    return [int(state.episodic[p].id[1:]) for p in ranking(state, "", config)["episodic"]]


@given(st.lists(unit, min_size=2, max_size=8), st.integers(min_value=1, max_value=50),
       st.sampled_from([0.5, 3.0, 20.0, 1000.0]))
def test_of_memories_of_one_age_the_more_important_never_has_the_lower_recency(
    significances: list[float], age: int, half_life: float
) -> None:
    """Recency alone: memories of one tick (and one text: one relevance) rank by significance,
    the more significant first; one ranks before a more significant one only when their
    recency is equal, which rounding allows for significances a hair apart (the tie goes
    to the newer)."""
    ranked = _memories_ranked([(0, s) for s in significances] + [(age, 0.0)], half_life)
    same_age = [i for i in ranked if i < len(significances)]
    for before, after in itertools.combinations(same_age, 2):
        a, b = significances[before], significances[after]
        assert a >= b or (before > after and b - a < 1e-6), (before, after)


@given(st.lists(unit, min_size=1, max_size=8), st.sampled_from([0.5, 3.0, 20.0, 1000.0]))
def test_at_age_0_importance_leaves_recency_alone(significances: list[float], half_life: float) -> None:
    """The newest memories all have recency 1, whatever their significance: newest first."""
    assert _memories_ranked([(7, s) for s in significances], half_life) == list(range(len(significances)))[::-1]


@given(st.integers(min_value=1, max_value=40))
def test_a_memory_of_importance_1_halves_in_two_half_lives(half_life: int) -> None:
    """Against a memory of significance 0 one half-life old (recency 1/2): the one of
    significance 1 ranks first while younger than two half-lives, and ties at two (the tie
    goes to the newer, the other one)."""
    for age, first in ((2 * half_life - 1, 0), (2 * half_life, 1), (2 * half_life + 1, 1)):
        newest = 2 * half_life + 1
        ranked = _memories_ranked([(newest - age, 1.0), (newest - half_life, 0.0), (newest, 0.0)], half_life)
        assert ranked[1] == first, age
