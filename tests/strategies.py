"""Hypothesis strategies for NPC states and working-memory configs."""

from __future__ import annotations

from hypothesis import strategies as st

from sim.memory import (
    SELECTIONS,
    Belief,
    Episode,
    Fact,
    Line,
    NpcState,
    ScoredSelection,
    WorkingMemoryConfig,
    WorldFact,
)

# ASCII words, combining marks, emoji, CJK, and the odd newline.
_ALPHABET = st.sampled_from(
    [*"abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ.,!?'-:0123456789",
     "\u0301", "\u0308", "\u20dd", "\U0001f600", "\U0001f44d", "\U0001f3fd", "\u732b", "\u738b",
     "\u6b7b", "\u00e9", "\u00df", "\u0416", "\n", "#"]
)
# A few words shared by items and inputs, so that a scored selection finds relevance.
_WORDS = st.lists(st.sampled_from(["gate", "siege", "Gate", "weather", "the", "bread", "smith", "\u738b"]),
                  max_size=8).map(" ".join)
texts = st.one_of(st.text(_ALPHABET, min_size=0, max_size=60), _WORDS)
long_texts = st.one_of(texts, st.text(_ALPHABET, min_size=200, max_size=2500))
ids = st.text("abcdefghij0123456789-", min_size=1, max_size=6)
ticks = st.integers(min_value=0, max_value=50)
unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
# A few event ids, so that memories and lines of one event meet (a line carries its memory).
events = st.one_of(st.none(), st.sampled_from(["ev-1", "ev-2", "ev-3", "ev-4", "ev-5"]))

facts = st.builds(Fact, ids, texts)
worlds = st.builds(WorldFact, ids, texts)
episodes = st.builds(Episode, ids, ticks, long_texts, unit, events)
beliefs = st.builds(Belief, ids, ticks, long_texts, unit)
lines = st.builds(Line, ticks, st.sampled_from(["player", "npc", "\u5c0f\u660e"]), long_texts,
                  st.integers(min_value=0, max_value=3), events)


@st.composite
def states(draw: st.DrawFn, max_items: int = 25) -> NpcState:
    return NpcState(
        agent_id=draw(st.sampled_from(["smith", "snack_machine", "\u5c0f\u660e"])),
        system_prompt=draw(st.one_of(texts, st.text(_ALPHABET, min_size=100, max_size=400))),
        canonical_facts=draw(st.lists(facts, max_size=6, unique_by=lambda f: f.id)),
        world_state=draw(st.lists(worlds, max_size=5, unique_by=lambda w: w.key)),
        episodic=draw(st.lists(episodes, max_size=max_items)),
        beliefs=draw(st.lists(beliefs, max_size=max_items)),
        dialogue=draw(st.lists(lines, max_size=max_items)),
    )


player_inputs = st.one_of(st.just(""), texts)


@st.composite
def configs(
    draw: st.DrawFn, *, tokens: bool = False, redistribute: bool | None = None, selection: str | None = None,
    stable: bool | None = False, layout: str = "sections",
) -> WorkingMemoryConfig:
    """A config; `selection` None draws either selection (a scored one with drawn weights),
    `stable` None either value of `stable_prefix` (false in the log layout, which refuses it)."""
    chosen = draw(st.sampled_from(SELECTIONS)) if selection is None else selection
    weight = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.7])
    shares = draw(st.sampled_from([(0.60, 0.25, 0.15), (0.5, 0.3, 0.2), (0.0, 0.0, 1.0), (0.2, 0.2, 0.2), (1.0, 0, 0)]))
    return WorkingMemoryConfig(
        max_context_chars=draw(st.integers(min_value=0, max_value=3000)),
        max_context_tokens=draw(st.integers(min_value=0, max_value=700)) if tokens else None,
        max_dialogue_lines=draw(st.integers(min_value=0, max_value=12)),
        max_episodic_memories=draw(st.integers(min_value=0, max_value=7)),
        max_beliefs=draw(st.integers(min_value=0, max_value=5)),
        always_include_canonical_facts=draw(st.booleans()),
        always_include_world_state=draw(st.booleans()),
        dialogue_share=shares[0],
        episodic_share=shares[1],
        belief_share=shares[2],
        redistribute_unused=draw(st.booleans()) if redistribute is None else redistribute,
        selection=chosen,
        scored=ScoredSelection(
            half_life_ticks=draw(st.sampled_from([0.5, 3.0, 20.0, 1000.0])),
            recency_weight=draw(weight),
            importance_weight=draw(weight),
            relevance_weight=draw(weight),
            dialogue_importance=draw(unit),
        ),
        stable_prefix=(draw(st.booleans()) if stable is None else stable) and layout == "sections",
        layout=layout,
    )
