"""The ranking of `selection = "scored"`: each flexible category's items, best first.

An item's score is

    recency_weight * 0.5 ** (age * (1 - 0.5 * importance) / half_life_ticks)
    + importance_weight * importance
    + relevance_weight * relevance

`age` counts the ticks since the state's newest flexible item; `importance` is an episode's
significance, a belief's confidence, `dialogue_importance` for a line; `relevance` is the
Okapi BM25 score of the item's words (a line's text, not its speaker) against the words of
the input and of the addressee (the NPC's id), divided by what an item holding every such
word at its best weight would score, so it lies in [0, 1]. The more important an item, the
slower it fades (LlamaBrain's rule: the decay rate scaled by 1 - 0.5 * importance), so an
item of importance 1 halves every two half-lives, whatever the importance weight. Ties go
to the newer item, so the ranking is a total order and "recency" is what it becomes with
weights (1, 0, 0) among items of one importance (the dialogue's always are).

The whole state is ranked; a build passes over the memories that the dialogue's kept lines
say already (`sim.memory._duplicates`), so it takes the memories' ranking as far as its cap
reaches once those are passed over (`capped_ranking`).

Deterministic (I4): words are NFKC-normalised and case-folded; floats are combined in one
fixed order (query words sorted), never through set or dict iteration order.

Cost: a state is indexed once (each item's word counts, remembered per text, and in how
many items each word is) and cached on the state object like its rendering, with its base
scores per config; an input's relevance is one pass over the items (the items holding a
telling word found without building a set, only those scored), and a build sorts the
totals once, by a key, keeping the best up to the category's cap (remembered per input,
config and cap, for the retry and the explanation that follow a build).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

from sim.memory._budget import WorkingMemoryConfig
from sim.memory._duplicates import carried
from sim.memory._state import Belief, Episode, Line, NpcState

__all__ = ["SCORED", "capped_ranking", "decay", "ranking", "words"]

SCORED = ("beliefs", "episodic", "dialogue")
"""The categories a scored selection ranks, in the prompt's order."""

_WORD = re.compile(r"\w+")
_K1 = 1.2
_B = 0.75
_INDEX = "_npcsim_scoring"
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
_TEXT, _TICK = operator.attrgetter("text"), operator.attrgetter("tick")
_CONFIDENCE, _SIGNIFICANCE = operator.attrgetter("confidence"), operator.attrgetter("significance")
Flexible = Episode | Belief | Line


def words(text: str) -> list[str]:
    """The normalised words of a text: NFKC, case-folded, runs of letters and digits."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def decay(age: float, importance: float, half_life: float) -> float:
    """What is left of an item's recency after `age` ticks: it halves every `half_life` ticks,
    slower the more important the item (every two half-lives at importance 1), so that what
    mattered is remembered longer."""
    return math.pow(0.5, age * (1.0 - 0.5 * importance) / half_life)


@functools.lru_cache(maxsize=1 << 16)
def _counts(text: str) -> tuple[dict[str, int], int]:
    """Each word of a text with its count, and the number of words (never mutated: shared).
    Remembered: an item recurs in the states of every NPC that heard it and every later turn."""
    found = words(text)
    return dict(Counter(found)), len(found)


@functools.lru_cache(maxsize=1024)
def _query(player_input: str, agent_id: str) -> tuple[str, ...]:
    """The words relevance is measured against, in one fixed order (sorted)."""
    return tuple(sorted(set(words(player_input)) | set(words(agent_id))))


class _Index:
    """One category's items as BM25 sees them (word counts), the relevance of each query
    asked, its base scores per config and its rankings per query, config and limit."""

    __slots__ = ("average", "bases", "counts", "df", "importance", "lengths", "queries", "ranked", "size", "ticks")

    def __init__(self, texts: Sequence[str], ticks: list[int], importance: list[float] | None) -> None:
        """`texts`, `ticks` and `importance` per item; importance None for dialogue, whose
        lines share the config's constant."""
        self.size = len(texts)
        self.ticks = ticks
        self.importance = importance
        counted = list(map(_counts, texts))
        self.counts = list(map(_FIRST, counted))
        self.lengths = list(map(_SECOND, counted))
        self.average = sum(self.lengths) / self.size if self.size else 0.0
        self.df: Counter[str] | None = None
        self.queries: dict[tuple[str, ...], tuple[dict[int, float], float]] = {}
        self.bases: dict[tuple[float, float, float, float], list[float]] = {}
        self.ranked: dict[tuple[tuple[str, ...], _Weights, int | None], tuple[int, ...]] = {}

    def relevance(self, query: tuple[str, ...]) -> tuple[dict[int, float], float]:
        """The BM25 sum of each item the query's words touch, and what an item holding every
        such word at its best weight would score (relevance 1); remembered per query, for
        the retry and the explanation that follow a build.

        A word in more than half the items is left out: BM25's classic idf is negative
        there, it tells none of them apart (and it would touch most of them). Sums are taken
        in the query's order (sorted), never a set's.
        """
        found = self.queries.get(query)
        if found is None:
            if self.df is None:  # once per state: in how many items each word is
                self.df = Counter(itertools.chain.from_iterable(self.counts))
            df, counts = self.df, self.counts
            n, lengths, average = self.size, self.lengths, self.average
            idf = {word: math.log(1.0 + (n - k + 0.5) / (k + 0.5))
                   for word in query if 0 < 2 * (k := df.get(word, 0)) <= n}
            telling = list(idf)  # in the query's order
            wanted = frozenset(telling)
            raw: dict[int, float] = {}
            best: dict[str, float] = {}
            touched = list(itertools.compress(range(n), map(operator.not_, map(wanted.isdisjoint, counts))))
            for p in touched:
                held, total, norm_length = counts[p], 0.0, _K1 * (1.0 - _B + _B * lengths[p] / average)
                for word in telling:
                    if word in held:
                        tf = held[word]
                        weight = idf[word] * tf * (_K1 + 1.0) / (tf + norm_length)
                        total += weight
                        if weight > best.get(word, 0.0):
                            best[word] = weight
                raw[p] = total
            found = self.queries[query] = (raw, sum(best[word] for word in query if word in best))
        return found

    def base(self, cfg: WorkingMemoryConfig, newest: int) -> list[float]:
        """Recency (its decay slowed by importance) and importance per item: once per state and
        config (the key holds everything read here besides the state's items)."""
        scored = cfg.scored
        key = (scored.half_life_ticks, scored.recency_weight, scored.importance_weight, scored.dialogue_importance)
        found = self.bases.get(key)
        if found is None:
            importance = self.importance or [scored.dialogue_importance] * self.size
            half_life, recency, weighted = scored.half_life_ticks, scored.recency_weight, scored.importance_weight
            found = self.bases[key] = [
                recency * decay(newest - tick, weight, half_life) + weighted * weight
                for tick, weight in zip(self.ticks, importance, strict=True)
            ]
        return found

    def top(self, query: tuple[str, ...], cfg: WorkingMemoryConfig, newest: int, limit: int | None) -> tuple[int, ...]:
        """The positions of the `limit` best items (all with None), best first: by score, then
        the newer first. Remembered per query, config and limit (a retry and an explanation
        ask again)."""
        key = (query, _weights(cfg), limit)
        found = self.ranked.get(key)
        if found is None:
            totals = self.base(cfg, newest)
            raw, norm = self.relevance(query) if cfg.scored.relevance_weight != 0.0 else ({}, 0.0)
            if raw:
                scale, base = cfg.scored.relevance_weight / norm, totals
                totals = base.copy()
                for p, r in raw.items():
                    totals[p] = base[p] + scale * r
            found = self.ranked[key] = _best(totals, limit)
        return found


_Weights = tuple[float, float, float, float, float]


def _weights(cfg: WorkingMemoryConfig) -> _Weights:
    scored = cfg.scored
    return (scored.half_life_ticks, scored.recency_weight, scored.importance_weight, scored.dialogue_importance,
            scored.relevance_weight)


def _best(totals: list[float], limit: int | None) -> tuple[int, ...]:
    """The positions of the `limit` highest totals (all with None), highest first; ties: the higher position
    (a stable sort of the positions from the newest)."""
    order = sorted(range(len(totals) - 1, -1, -1), key=totals.__getitem__, reverse=True)
    return tuple(order if limit is None else order[:limit])


def _indexes(state: NpcState) -> tuple[dict[str, _Index], int]:
    """The state's category indexes and its newest flexible tick: computed once per state."""
    cached: tuple[dict[str, _Index], int] | None = state.__dict__.get(_INDEX)
    if cached is None:
        beliefs, episodic, dialogue = state.beliefs, state.episodic, state.dialogue
        indexes = {
            "beliefs": _Index(list(map(_TEXT, beliefs)), list(map(_TICK, beliefs)), list(map(_CONFIDENCE, beliefs))),
            "episodic": _Index(list(map(_TEXT, episodic)), list(map(_TICK, episodic)),
                               list(map(_SIGNIFICANCE, episodic))),
            "dialogue": _Index(list(map(_TEXT, dialogue)), list(map(_TICK, dialogue)), None),
        }
        newest = max((items[-1].tick for items in (state.beliefs, state.episodic, state.dialogue) if items),
                     default=0)
        cached = state.__dict__[_INDEX] = (indexes, newest)
    return cached


def ranking(
    state: NpcState,
    player_input: str,
    cfg: WorkingMemoryConfig,
    limits: dict[str, int] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Per scored category, its items' positions in the state (oldest is 0), best first.

    `limits` cuts a category's ranking after that many items (its cap): the top of the
    whole ranking, the same positions in the same order.
    """
    return {name: _ranked(state, name, player_input, cfg, None if limits is None else limits[name])
            for name in SCORED}


def _ranked(
    state: NpcState, name: str, player_input: str, cfg: WorkingMemoryConfig, limit: int | None
) -> tuple[int, ...]:
    """One category's ranking, as `ranking` gives it."""
    indexes, newest = _indexes(state)
    index = indexes[name]
    if limit == 0 or index.size == 0:
        return ()
    if limit is not None and limit >= index.size:
        limit = None
    return index.top(_query(player_input, state.agent_id), cfg, newest, limit)


def capped_ranking(state: NpcState, player_input: str, cfg: WorkingMemoryConfig) -> dict[str, tuple[int, ...]]:
    """Each category's ranking as far as a build can reach: up to its cap, and for the
    memories past as many more as the dialogue's first `max_dialogue_lines` lines (the most
    it can keep) carry, since a memory a kept line carries is passed over."""
    lines = _ranked(state, "dialogue", player_input, cfg, cfg.max_dialogue_lines)
    carries = carried(state)
    said = len(carries.said(lines)) if carries is not None else 0
    return {
        "beliefs": _ranked(state, "beliefs", player_input, cfg, cfg.max_beliefs),
        "episodic": _ranked(state, "episodic", player_input, cfg, cfg.max_episodic_memories + said),
        "dialogue": lines,
    }
