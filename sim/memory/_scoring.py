"""The ranking of `selection = "scored"`: each flexible category's items, best first.

An item's score is

    recency_weight * 0.5 ** (age / half_life_ticks)
    + importance_weight * importance
    + relevance_weight * relevance

`age` counts the ticks since the state's newest flexible item; `importance` is an episode's
significance, a belief's confidence, `dialogue_importance` for a line; `relevance` is the
Okapi BM25 score of the item's words (a line's text, not its speaker) against the words of
the input and of the addressee (the NPC's id), divided by what an item holding every such word at its best weight would
score, so it lies in [0, 1]. A `Relevance`
callable (an embedding model, say) may supply it instead. Ties go to the newer item, so
the ranking is a total order and "recency" is what it becomes with weights (1, 0, 0).

The whole state is ranked; `candidates` then leaves out the memories that the dialogue's
candidate lines (the first `max_dialogue_lines` of its ranking) say already
(`sim.memory._duplicates`), and the memories' ranking is the whole one without them.

Deterministic (I4): words are NFKC-normalised and case-folded; floats are combined in one
fixed order (query words sorted), never through set or dict iteration order.

Cost: a state is indexed once (each item's word counts, remembered per text) and cached on
the state object like its rendering, with its base scores and order per config; an input's
relevance is one pass of set intersections over the items, and the items it touches are
sorted once (both remembered per input, for the retry and the explanation that follow a
build); a build merges those with the base order, stopping at the category's cap.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence

from sim.errors import ConfigError
from sim.memory._budget import WorkingMemoryConfig
from sim.memory._duplicates import Distinct, distinct
from sim.memory._state import Belief, Episode, Line, NpcState, item_text

__all__ = ["SCORED", "Relevance", "candidates", "ranking", "words"]

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
    asked, and its base scores per config."""

    __slots__ = ("average", "bases", "boosts", "counts", "importance", "lengths", "queries", "size", "ticks")

    def __init__(self, texts: Sequence[str], ticks: list[int], importance: list[float] | None) -> None:
        """`texts`, `ticks` and `importance` per item; importance None for dialogue, whose
        lines share the config's constant."""
        self.size = len(texts)
        self.ticks = ticks
        self.importance = importance
        counted = [_counts(text) for text in texts]
        self.counts = [c for c, _ in counted]
        self.lengths = [length for _, length in counted]
        self.average = sum(self.lengths) / self.size if self.size else 0.0
        self.queries: dict[tuple[str, ...], tuple[dict[int, float], float]] = {}
        self.boosts: dict[tuple[tuple[str, ...], float, float, float, float, float], list[tuple[float, int]]] = {}
        self.bases: dict[tuple[float, float, float, float], tuple[list[float], list[int]]] = {}

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
            wanted = frozenset(query)
            touched = [(p, words) for p, c in enumerate(self.counts) if (words := c.keys() & wanted)]
            df = Counter(word for _, words in touched for word in words)
            n, lengths, average = self.size, self.lengths, self.average
            idf = {word: math.log(1.0 + (n - k + 0.5) / (k + 0.5))
                   for word in query if 0 < 2 * (k := df.get(word, 0)) <= n}
            telling = list(idf)  # in the query's order
            raw: dict[int, float] = {}
            best: dict[str, float] = {}
            for p, held in touched:
                if held.isdisjoint(idf):
                    continue
                c, total, norm_length = self.counts[p], 0.0, _K1 * (1.0 - _B + _B * lengths[p] / average)
                for word in telling:
                    if word in held:
                        tf = c[word]
                        weight = idf[word] * tf * (_K1 + 1.0) / (tf + norm_length)
                        total += weight
                        if weight > best.get(word, 0.0):
                            best[word] = weight
                raw[p] = total
            found = self.queries[query] = (raw, sum(best[word] for word in query if word in best))
        return found

    def boosted(
        self, query: tuple[str, ...], cfg: WorkingMemoryConfig, scores: list[float]
    ) -> tuple[dict[int, float], list[tuple[float, int]]]:
        """The items the query touches (with their BM25 sums) and their sort keys, best first
        (the negated score, then the negated position: ties go to the newer); remembered per
        query and config."""
        raw, norm = self.relevance(query)
        key = (query, cfg.half_life_ticks, cfg.recency_weight, cfg.importance_weight, cfg.dialogue_importance,
               cfg.relevance_weight)
        found = self.boosts.get(key)
        if found is None:
            scale = cfg.relevance_weight / norm if raw else 0.0
            found = self.boosts[key] = sorted((-(scores[p] + scale * r), -p) for p, r in raw.items())
        return raw, found

    def base(self, cfg: WorkingMemoryConfig, newest: int) -> tuple[list[float], list[int]]:
        """Recency and importance per item, and the positions in that order (best first)."""
        key = (cfg.half_life_ticks, cfg.recency_weight, cfg.importance_weight, cfg.dialogue_importance)
        found = self.bases.get(key)
        if found is None:  # once per state and config
            importance = self.importance or [cfg.dialogue_importance] * self.size
            scores = [
                cfg.recency_weight * 0.5 ** ((newest - tick) / cfg.half_life_ticks) + cfg.importance_weight * weight
                for tick, weight in zip(self.ticks, importance, strict=True)
            ]
            order = [p for _, p in sorted(zip(scores, range(self.size), strict=True), reverse=True)]  # ties: the newer
            found = self.bases[key] = (scores, order)
        return found


def _indexes(state: NpcState) -> tuple[dict[str, _Index], int]:
    """The state's category indexes and its newest flexible tick: computed once per state."""
    cached: tuple[dict[str, _Index], int] | None = state.__dict__.get(_INDEX)
    if cached is None:
        indexes = {
            "beliefs": _Index([b.text for b in state.beliefs], [b.tick for b in state.beliefs],
                              [b.confidence for b in state.beliefs]),
            "episodic": _Index([e.text for e in state.episodic], [e.tick for e in state.episodic],
                               [e.significance for e in state.episodic]),
            "dialogue": _Index([line.text for line in state.dialogue], [line.tick for line in state.dialogue], None),
        }
        newest = max((items[-1].tick for items in (state.beliefs, state.episodic, state.dialogue) if items),
                     default=0)
        cached = state.__dict__[_INDEX] = (indexes, newest)
    return cached


def _supplied(relevance: Relevance, player_input: str, name: str, items: Sequence[Flexible]) -> list[float]:
    scores = relevance(player_input, name, tuple(item_text(item) for item in items))
    if len(scores) != len(items):
        raise ConfigError(f"relevance: {len(scores)} scores for {len(items)} {name} items")
    for score in scores:
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0.0 <= score <= 1.0:
            raise ConfigError(f"relevance: a {name} score must be a number from 0 to 1, got {score!r}")
    return [float(score) for score in scores]


def ranking(
    state: NpcState,
    player_input: str,
    cfg: WorkingMemoryConfig,
    relevance: Relevance | None = None,
    limits: dict[str, int] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Per scored category, its items' positions in the state (oldest is 0), best first.

    `limits` stops a category's ranking after that many items (its cap): the top of the
    whole ranking, the same positions in the same order, without sorting the rest.
    """
    indexes, newest = _indexes(state)
    query = _query(player_input, state.agent_id)
    weight = cfg.relevance_weight
    ranked: dict[str, tuple[int, ...]] = {}
    for name in SCORED:
        index = indexes[name]
        scores, order = index.base(cfg, newest)
        limit = index.size if limits is None else min(limits[name], index.size)
        if weight == 0.0 or limit == 0:
            ranked[name] = tuple(order[:limit])
            continue
        if relevance is not None:
            given = _supplied(relevance, player_input, name, getattr(state, name))
            totals = [base + weight * r for base, r in zip(scores, given, strict=True)]
            best = sorted(zip(totals, range(index.size), strict=True), reverse=True)[:limit]  # ties: the newer
            ranked[name] = tuple(p for _, p in best)
            continue
        raw, boosted = index.boosted(query, cfg, scores)
        if not raw:
            ranked[name] = tuple(order[:limit])
            continue
        best = boosted[:limit]
        best.extend((-scores[p], -p) for p in itertools.islice((p for p in order if p not in raw), limit))
        best.sort()
        ranked[name] = tuple(-p for _, p in best[:limit])
    return ranked


def candidates(
    state: NpcState,
    player_input: str,
    cfg: WorkingMemoryConfig,
    relevance: Relevance | None = None,
    limits: dict[str, int] | None = None,
) -> tuple[Distinct, dict[str, tuple[int, ...]]]:
    """What a working memory chooses from, and with a scored selection the order it chooses in.

    Recency: the state without the memories its newest `max_dialogue_lines` lines say, and no
    ranking (the order is newest first). Scored: the dialogue's candidate lines are the first
    `max_dialogue_lines` of its ranking, and each category's ranking is of the candidates
    (positions in the returned state, best first). `limits` as for `ranking`; the dialogue's
    must be at least `max_dialogue_lines`.
    """
    if cfg.selection != "scored":
        return distinct(state, cfg.max_dialogue_lines), {}
    cap = max(cfg.max_dialogue_lines, 0)
    first = ranking(state, player_input, cfg, relevance, None if limits is None else {**limits, "episodic": 0})
    chosen = distinct(state, cap, first["dialogue"])
    if limits is None:
        ranks = first
    else:  # the memories ranked as far as the cap reaches once the duplicates are passed over
        wanted = min(limits["episodic"] + len(chosen.duplicates), len(state.episodic))
        ranks = {**first, "episodic": ranking(state, player_input, cfg, relevance,
                                              {"dialogue": 0, "beliefs": 0, "episodic": wanted})["episodic"]}
    if chosen.duplicates:
        left_out = {id(e) for e in chosen.duplicates}
        where = {p: i for i, p in enumerate(p for p, e in enumerate(state.episodic) if id(e) not in left_out)}
        episodic = tuple(where[p] for p in ranks["episodic"] if p in where)
        ranks = {**ranks, "episodic": episodic if limits is None else episodic[: limits["episodic"]]}
    return chosen, ranks
