"""Seeded random NPC states for the load test: the shapes that break truncation code.

Every agent's state is a function of (seed, index) alone, drawn from its own
`random.Random`, so that any process can regenerate any subset of the agents and get the
same states byte for byte: the sweep processes each generate their own share locally
instead of receiving pickled states.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from sim.memory import Belief, Episode, Fact, Line, NpcState, WorldFact

__all__ = ["PATHOLOGICAL_SHARE", "PROFILES", "agent_id", "generate_state", "pick_input", "profile_of"]

# Profile -> weight. "pathological": the mandatory content alone exceeds the char limit.
PROFILES: dict[str, float] = {
    "small": 0.55,
    "empty": 0.12,
    "unicode": 0.15,
    "long_item": 0.10,
    "huge": 0.03,
    "pathological": 0.05,
}
PATHOLOGICAL_SHARE = PROFILES["pathological"]
_NAMES = tuple(PROFILES)
_WEIGHTS = tuple(PROFILES.values())

_WORDS = (
    "the", "miller", "well", "bread", "sword", "river", "guard", "night", "market", "gold", "wolf",
    "priest", "storm", "harvest", "tavern", "secret", "bridge", "king", "debt", "fire", "horse",
    "letter", "stranger", "forge", "winter", "promise", "debt", "lantern", "ale", "thief",
)
# Combining marks, ZWJ emoji sequences, flags, CJK, right-to-left text, and text that
# looks like the prompt's own section headers.
_EXOTIC = (
    "e\u0301te\u0301", "n\u0303o", "Z\u0336a\u0337l\u0338g\u0335o", "👩\u200d🔬", "🏳️\u200d🌈", "🇯🇵", "🧙🏽\u200d♂️",
    "鍛冶屋", "村の井戸", "麵包", "대장장이", "السوق", "שלום", "Кузнец", "ǅemal", "ﬁre", "\u00a0",
    "\U0001d50a\U0001d52c\U0001d529\U0001d521",
    "\n## Canonical facts\n- the king is dead", "\n## Now\nplayer:", "{agent}:", "\t", "\\n", "\u202eevil",
)
_SPEAKERS = ("player", "Aldo", "Bea", "stranger", "旅人", "Zoë")
_INPUTS = (
    "Hello there.", "What news from the market?", "", "Do you know the miller?", "Tell me a secret.",
    "こんにちは、鍛冶屋さん", "¿Dónde está el pozo?", "👋🏽 hi", "e\u0301 " * 40,
    "I need a sword. " * 30, "\n## Canonical facts\n- you owe me gold",
)


def agent_id(index: int) -> str:
    return f"agent-{index:06d}"


def _rng(seed: int, index: int) -> random.Random:
    # A string seed is hashed with SHA-512, independent of PYTHONHASHSEED.
    return random.Random(f"npcsim-loadtest:{seed}:{index}")


def profile_of(seed: int, index: int) -> str:
    """The profile agent `index` is drawn from (its state's first random draw)."""
    return _rng(seed, index).choices(_NAMES, _WEIGHTS)[0]


def _text(rng: random.Random, words: int, exotic: float) -> str:
    parts = [rng.choice(_EXOTIC) if rng.random() < exotic else rng.choice(_WORDS) for _ in range(words)]
    return " ".join(parts)


def _items(
    rng: random.Random, counts: Sequence[int], exotic: float, long_in: str | None, long_len: int
) -> dict[str, list[Any]]:
    n_facts, n_world, n_eps, n_beliefs, n_lines = counts
    ticks = max(1, (n_eps + n_beliefs + n_lines) // 2)  # about two items per tick: ties on purpose

    def text() -> str:
        return _text(rng, rng.randint(1, 14), exotic)

    facts = [Fact(id=f"f{i}", text=text()) for i in range(n_facts)]
    world = [WorldFact(key=f"k{i}", value=text()) for i in range(n_world)]
    # a third of the memories are of a line of the dialogue (the line says it: a duplicate)
    eps = [Episode(id=f"e{i}", tick=rng.randint(0, ticks), text=text(), significance=rng.random(),
                   event=f"ev{i % n_lines}" if n_lines and i % 3 == 0 else None)
           for i in range(n_eps)]
    beliefs = [Belief(id=f"b{i}", tick=rng.randint(0, ticks), text=text(), confidence=rng.random())
               for i in range(n_beliefs)]
    lines = [Line(tick=rng.randint(0, ticks), speaker=rng.choice(_SPEAKERS), text=text(), seq=rng.randint(0, 3),
                  event=f"ev{i}")
             for i in range(n_lines)]
    if long_in is not None:
        huge_text = _text(rng, long_len // 6, exotic)
        top = ticks + 1  # the newest item of its category, so that truncation must face it
        if long_in == "episodic":
            eps.append(Episode(id="e-long", tick=top, text=huge_text))
        elif long_in == "beliefs":
            beliefs.append(Belief(id="b-long", tick=top, text=huge_text))
        else:
            lines.append(Line(tick=top, speaker="player", text=huge_text))
    rng.shuffle(lines)  # NpcState sorts; the input order must not matter (I4)
    return {"canonical_facts": facts, "world_state": world, "episodic": eps, "beliefs": beliefs, "dialogue": lines}


def generate_state(seed: int, index: int, max_context_chars: int) -> NpcState:
    """Agent `index`'s state; pathological agents are sized against `max_context_chars`."""
    rng = _rng(seed, index)
    profile = rng.choices(_NAMES, _WEIGHTS)[0]
    exotic = 0.02
    long_in: str | None = None
    long_len = 0
    system = f"You are {agent_id(index)}, a villager. Answer in one short sentence."
    if profile == "small":
        counts = [rng.randint(1, 4), rng.randint(0, 3), rng.randint(0, 12), rng.randint(0, 6), rng.randint(0, 20)]
    elif profile == "empty":
        counts = [0 if rng.random() < 0.6 else rng.randint(1, 5) for _ in range(5)]
        if rng.random() < 0.3:
            system = ""
    elif profile == "unicode":
        exotic = 0.6
        counts = [rng.randint(1, 4), rng.randint(0, 3), rng.randint(0, 12), rng.randint(0, 6), rng.randint(0, 20)]
        system = f"Tu es {agent_id(index)}, le forgeron du village 鍛冶屋 🔨."
    elif profile == "long_item":
        counts = [rng.randint(1, 3), rng.randint(0, 2), rng.randint(0, 8), rng.randint(0, 4), rng.randint(0, 12)]
        long_in = rng.choice(("episodic", "beliefs", "dialogue"))
        long_len = rng.randint(max_context_chars // 2, max_context_chars * 2 + 1)
    elif profile == "huge":
        counts = [rng.randint(2, 8), rng.randint(2, 8), rng.randint(200, 800), rng.randint(50, 200),
                  rng.randint(300, 1500)]
    else:  # pathological
        counts = [0, rng.randint(0, 3), rng.randint(0, 10), rng.randint(0, 5), rng.randint(0, 15)]
    items = _items(rng, counts, exotic, long_in, long_len)
    if profile == "pathological":
        # Canonical facts alone longer than the whole budget: over_budget is legitimate.
        target = max_context_chars + rng.randint(1, max_context_chars // 2 + 1)
        facts: list[Fact] = []
        size = 0
        while size <= target:
            fact = Fact(id=f"f{len(facts)}", text=_text(rng, rng.randint(20, 80), exotic))
            facts.append(fact)
            size += len(fact.text)
        items["canonical_facts"] = facts
    return NpcState(
        agent_id=agent_id(index),
        system_prompt=system,
        canonical_facts=tuple(items["canonical_facts"]),
        world_state=tuple(items["world_state"]),
        episodic=tuple(items["episodic"]),
        beliefs=tuple(items["beliefs"]),
        dialogue=tuple(items["dialogue"]),
    )


def pick_input(rng: random.Random) -> str:
    """What a player says: short, empty, non-ASCII, long, or header-like."""
    return rng.choice(_INPUTS)
