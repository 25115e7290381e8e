"""The ranking of `selection = "scored"`: each flexible category's items, best first.

An item's score is

    recency_weight * 0.5 ** (age / half_life_ticks)
    + importance_weight * importance
    + relevance_weight * relevance

`age` counts the ticks since the state's newest flexible item; `importance` is an episode's
significance, a belief's confidence, `dialogue_importance` for a line; `relevance` is the
Okapi BM25 score of the item's words against the words of the input and of the addressee
(the NPC's id), divided by the category's best, so it lies in [0, 1]. A `Relevance`
callable (an embedding model, say) may supply it instead. Ties go to the newer item, so
the ranking is a total order and "recency" is what it becomes with weights (1, 0, 0).

Deterministic (I4): words are NFKC-normalised and case-folded; floats are combined in one
fixed order (query words sorted), never through set or dict iteration order.

Cost: a state is indexed once (each item's words, and for each word the items holding it
with their BM25 weight) and cached on the state object like its rendering; a build looks up
the input's words, adds the relevance of the few items they touch to the cached base scores
and merges those items into the cached base order, stopping at the category's cap.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence

from sim.errors import ConfigError
from sim.memory._budget import WorkingMemoryConfig
from sim.memory._state import Belief, Episode, Line, NpcState, item_text

__all__ = ["SCORED", "Relevance", "ranking", "words"]

SCORED = ("beliefs", "episodic", "dialogue")
"""The categories a scored selection ranks, in the prompt's order."""

Relevance = Callable[[str, str, tuple[str, ...]], Sequence[float]]
"""`relevance(player_input, category, texts)`: one score in [0, 1] per text (the items' texts,
oldest first, as `explain_truncation` names them), used instead of the lexical score."""

_WORD = re.compile(r"\w+")
_K1 = 1.2
_B = 0.75
_INDEX = "_npcsim_scoring"
Flexible = Episode | Belief | Line


def words(text: str) -> list[str]:
    """The normalised words of a text: NFKC, case-folded, runs of letters and digits."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


class _Index:
    """One category's items as BM25 sees them, and its base scores per config."""

    __slots__ = ("bases", "importance", "postings", "size", "ticks")

    def __init__(self, items: Sequence[Flexible], importance: list[float] | None) -> None:
        """`importance` per item; None for dialogue, whose lines share the config's constant."""
        self.size = len(items)
        self.ticks = [item.tick for item in items]
        self.importance = importance
        counts = [Counter(words(item_text(item))) for item in items]
        lengths = [sum(c.values()) for c in counts]
        average = sum(lengths) / len(lengths) if lengths else 0.0
        found: dict[str, list[tuple[int, int]]] = {}
        for position, c in enumerate(counts):
            for word, tf in c.items():
                found.setdefault(word, []).append((position, tf))
        self.postings: dict[str, tuple[tuple[int, float], ...]] = {}
        n = self.size
        for word, hits in found.items():
            idf = math.log(1.0 + (n - len(hits) + 0.5) / (len(hits) + 0.5))
            self.postings[word] = tuple(
                (p, idf * tf * (_K1 + 1.0) / (tf + _K1 * (1.0 - _B + _B * lengths[p] / average)))
                for p, tf in hits
            )
        self.bases: dict[tuple[float, float, float, float], tuple[list[float], list[int]]] = {}

    def base(self, cfg: WorkingMemoryConfig, newest: int) -> tuple[list[float], list[int]]:
        """Recency and importance per item, and the positions in that order (best first)."""
        key = (cfg.half_life_ticks, cfg.recency_weight, cfg.importance_weight, cfg.dialogue_importance)
        found = self.bases.get(key)
        if found is None:
            importance = self.importance or [cfg.dialogue_importance] * self.size
            scores = [
                cfg.recency_weight * 0.5 ** ((newest - tick) / cfg.half_life_ticks) + cfg.importance_weight * weight
                for tick, weight in zip(self.ticks, importance, strict=True)
            ]
            order = sorted(range(self.size), key=lambda p: (-scores[p], -p))
            found = self.bases[key] = (scores, order)
        return found


def _indexes(state: NpcState) -> tuple[dict[str, _Index], int]:
    """The state's category indexes and its newest flexible tick: computed once per state."""
    cached: tuple[dict[str, _Index], int] | None = state.__dict__.get(_INDEX)
    if cached is None:
        indexes = {
            "beliefs": _Index(state.beliefs, [b.confidence for b in state.beliefs]),
            "episodic": _Index(state.episodic, [e.significance for e in state.episodic]),
            "dialogue": _Index(state.dialogue, None),
        }
        newest = max((items[-1].tick for items in (state.beliefs, state.episodic, state.dialogue) if items),
                     default=0)
        cached = state.__dict__[_INDEX] = (indexes, newest)
    return cached


def _lexical(index: _Index, query: Sequence[str]) -> dict[int, float]:
    """BM25 of the touched items (the others score 0), divided by the best: in (0, 1]."""
    raw: dict[int, float] = {}
    for word in query:
        for position, weight in index.postings.get(word, ()):
            raw[position] = raw.get(position, 0.0) + weight
    best = max(raw.values(), default=0.0)
    return {p: score / best for p, score in raw.items()} if best > 0.0 else {}


def _supplied(relevance: Relevance, player_input: str, name: str, items: Sequence[Flexible]) -> dict[int, float]:
    scores = relevance(player_input, name, tuple(item_text(item) for item in items))
    if len(scores) != len(items):
        raise ConfigError(f"relevance: {len(scores)} scores for {len(items)} {name} items")
    for score in scores:
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0.0 <= score <= 1.0:
            raise ConfigError(f"relevance: a {name} score must be a number from 0 to 1, got {score!r}")
    return {p: float(score) for p, score in enumerate(scores) if score > 0.0}


def ranking(
    state: NpcState,
    player_input: str,
    cfg: WorkingMemoryConfig,
    relevance: Relevance | None = None,
    limits: dict[str, int] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Per scored category, its items' positions in the state (oldest is 0), best first.

    `limits` stops a category's ranking after that many items (its cap): the top of the
    whole ranking, as cheaply as the input's words allow.
    """
    indexes, newest = _indexes(state)
    query = sorted(set(words(player_input)) | set(words(state.agent_id)))
    ranked: dict[str, tuple[int, ...]] = {}
    for name in SCORED:
        index = indexes[name]
        scores, order = index.base(cfg, newest)
        limit = index.size if limits is None else min(limits[name], index.size)
        if cfg.relevance_weight == 0.0:
            touched: dict[int, float] = {}
        elif relevance is not None:
            touched = _supplied(relevance, player_input, name, getattr(state, name))
        else:
            touched = _lexical(index, query)
        if not touched:
            ranked[name] = tuple(order[:limit])
            continue
        boosted = sorted(((-(scores[p] + cfg.relevance_weight * r), -p) for p, r in touched.items()))
        rest = ((-scores[p], -p) for p in order if p not in touched)
        ranked[name] = tuple(-p for _, p in itertools.islice(heapq.merge(boosted, rest), limit))
    return ranked
