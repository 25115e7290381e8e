"""Recall: what an NPC brings back, for what it is asked, from everything it kept.

A working memory is built from an NPC's hot state (its newest items per category). What
must outlive that window is kept apart: the NPC's significant episodes (`KEEP_SIGNIFICANCE`
or more: what a player said to it, what the game told it, what it chose to remember), at most
`MAX_KEPT` of them, the weakest (`strength`) given up first; and the summaries its place
folds its overheard talk into (`summary_of`), never a significant episode. When the NPC
speaks under a scored selection with `[memory.scored] recall = N`, `recall` ranks what it
kept against what it was told, and the N best (that its state does not hold already) join
its state as candidates; the scored ranking, budgets, caps and rendering then apply as to
any item. The state with them is the one the audit records, so a replay needs no store.

Ranking is Okapi BM25 over the kept items alone (the NPC's own statistics, never a
table's shared by other NPCs or shards), with the words of the question less the most
common English words, so a question with nothing in common with a memory recalls nothing.
Deterministic: words sorted, ties by (score, tick, id), never a set's or dict's order.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections import Counter
from collections.abc import Collection, Sequence

import msgspec

from sim.memory._budget import WorkingMemoryConfig
from sim.memory._quotes import own_words
from sim.memory._scoring import words
from sim.memory._state import Episode, NpcState

__all__ = [
    "FOLD_EVENTS",
    "KEEP_SIGNIFICANCE",
    "MAX_KEPT",
    "MAX_SUMMARIES",
    "SUMMARY_SIGNIFICANCE",
    "hot_and_kept",
    "kept_rank",
    "recall",
    "recalled_for",
    "strength",
    "summary_of",
    "with_recalled",
]

KEEP_SIGNIFICANCE = 0.8
"""Episodes at least this significant are kept for recall: what a player said to the NPC
(0.9), what it chose to remember, what the game told it as important. Talk between NPCs
(0.7 when said to it) is its place's, folded into summaries: kept per NPC it would cost a
busy world's memory as many episodes as lines."""
MAX_KEPT = 128
"""Kept episodes per NPC; past it the weakest goes (`strength`), so the store stays bounded."""
FOLD_EVENTS = 32
"""A place folds its talk into a summary once this many events wait to be folded."""
MAX_SUMMARIES = 128
"""Summaries kept per place; the oldest is forgotten when a new one is made."""
SUMMARY_SIGNIFICANCE = 0.4
"""A summary's significance: above overheard chatter (0.3), below what was said to the NPC."""

_K1 = 1.2
_B = 0.75
_QUOTE_CHARS = 60
_EXTRACTS = 2
_SPEAKERS = 4
_ELLIPSIS = "\u2026"

_STOPWORD_TEXT = (
    "a about after again all am an and any are as at be been before being but by can could did do does "
    "doing down for from had has have having he her here hers him his how i if in into is it its just me "
    "more most my no nor not now of off on once only or other our ours out over own said say says same "
    "she should so some such than that the their theirs them then there these they this those through to "
    "too under until up very was we were what when where which while who whom why will with would you "
    "your yours "
)
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
"""Words that tell no memory apart: a question's words less these are what it recalls by."""


def strength(episode: Episode) -> tuple[float, int, str]:
    """How strongly a kept episode holds, weakest first when sorted: significance, then age
    (the newer holds), then id; the weakest is what `MAX_KEPT` gives up."""
    return (episode.significance, episode.tick, episode.id)


def kept_rank(kept: Sequence[Episode]) -> int:
    """The position of the weakest of `kept` (what a full store gives up for a stronger one)."""
    return min(range(len(kept)), key=lambda p: strength(kept[p]))


def _telling(text: str) -> list[str]:
    return [w for w in words(text) if w not in STOPWORDS]


@functools.lru_cache(maxsize=1 << 16)
def _counted(text: str) -> tuple[dict[str, int], int]:
    """A kept text's telling words with their counts, and how many there are (shared, never
    mutated: a summary is recalled by every NPC of its place)."""
    found = _telling(text)
    return dict(Counter(found)), len(found)


def recall(kept: Sequence[Episode], question: str, top: int, *, present: Collection[str] = (),
           said: Collection[str] = ()) -> tuple[Episode, ...]:
    """The `top` items of `kept` that best answer `question`, in recency order; none when no
    telling word of the question is in any of them.

    `present` are ids the state holds already (never recalled twice) and `said` the events
    whose memory would say nothing new (the one being answered: it is the input; those its
    dialogue's lines record). BM25 with the NPC's own statistics.
    """
    if top <= 0 or not kept:
        return ()
    query = sorted(set(_telling(question)))
    if not query:
        return ()
    pool = [e for e in kept if e.id not in present and e.event not in said]
    if not pool:
        return ()
    counted = [_counted(e.text) for e in pool]
    counts = list(map(operator.itemgetter(0), counted))
    n = len(pool)
    average = sum(map(operator.itemgetter(1), counted)) / n or 1.0
    wanted = frozenset(query)
    touched = list(itertools.compress(range(n), map(operator.not_, map(wanted.isdisjoint, counts))))
    if not touched:
        return ()
    df = Counter(w for p in touched for w in query if w in counts[p])
    idf = {w: math.log(1.0 + (n - k + 0.5) / (k + 0.5)) for w, k in df.items()}
    scored: list[tuple[float, int, str, Episode]] = []
    for p in touched:
        held, norm = counts[p], _K1 * (1.0 - _B + _B * counted[p][1] / average)
        total = 0.0
        for word in query:
            tf = held.get(word, 0)
            if tf:
                total += idf[word] * tf * (_K1 + 1.0) / (tf + norm)
        episode = pool[p]
        scored.append((total, episode.tick, episode.id, episode))
    scored.sort(key=lambda s: (s[0], s[1], s[2]), reverse=True)
    return tuple(sorted((s[3] for s in scored[:top]), key=lambda e: (e.tick, e.id)))


def recalled_for(state: NpcState, kept: Sequence[Episode], said: str, config: WorkingMemoryConfig, *,
                 speaker: str, answering: str | None = None) -> tuple[Episode, ...]:
    """What an NPC of `state` recalls from `kept` for `said` (what `speaker` said, "speaker:
    words" when it answers a line): a scored selection's `recall` best, nothing under any
    other selection. By the words said, not by who said them (a question about bread recalls
    nothing of what its asker once said about a relic); never what `state` holds, nor the
    memory of a line its dialogue holds or of the event `answering` (the input). The one
    rule a live run and `npcsim memory show` recall by."""
    top = config.scored.recall
    if config.selection != "scored" or not top:
        return ()
    events = {line.event for line in state.dialogue if line.event is not None}
    if answering is not None:
        events.add(answering)
    return recall(kept, said.removeprefix(f"{speaker}: "), top, present={e.id for e in state.episodic},
                  said=events)


def hot_and_kept(state: NpcState, hot_limit: int) -> tuple[NpcState, tuple[Episode, ...]]:
    """A whole history as a run holds it: the newest `hot_limit` items per flexible category,
    and the significant episodes it keeps (the newest `MAX_KEPT` by strength)."""
    kept = sorted((e for e in state.episodic if e.significance >= KEEP_SIGNIFICANCE), key=strength)[-MAX_KEPT:]
    hot = msgspec.structs.replace(state, episodic=state.episodic[-hot_limit:], beliefs=state.beliefs[-hot_limit:],
                                  dialogue=state.dialogue[-hot_limit:])
    return hot, tuple(kept)


def with_recalled(state: NpcState, recalled: Sequence[Episode]) -> NpcState:
    """`state` with `recalled` among its episodes (the state puts them in recency order)."""
    if not recalled:
        return state
    return msgspec.structs.replace(state, episodic=(*recalled, *state.episodic))


def summary_of(place: str, first: int, last: int, said: Sequence[tuple[str, str]]) -> Episode:
    """The summary of what was said at `place` in ticks `first` to `last`: `said` is each
    event's (speaker, text), "" for a notice of the game's, in order. Extractive: who spoke
    most, and the lines that hold the most of the block's common words, quoted one level
    (`own_words`) and cut short; the same events give the same text.
    """
    speakers = Counter(who for who, _ in said if who)
    block = Counter(w for _, text in said for w in set(_telling(text)))
    ranked = sorted(range(len(said)),
                    key=lambda p: (-sum(block[w] for w in set(_telling(said[p][1]))), p))[:_EXTRACTS]
    extracts = []
    for p in sorted(ranked):
        who, text = said[p]
        line = own_words(text)
        if len(line) > _QUOTE_CHARS:
            line = line[: _QUOTE_CHARS - 1].rstrip() + _ELLIPSIS
        extracts.append(f'{who or "news"}: "{line}"')
    talkers = ", ".join(f"{who} ({n})" for who, n in sorted(speakers.items(), key=lambda s: (-s[1], s[0]))[:_SPEAKERS])
    heard = f"Heard at {place}, ticks {first}-{last}: {len(said)} lines"
    text = f"{heard}, most from {talkers}; {'; '.join(extracts)}" if talkers else f"{heard}; {'; '.join(extracts)}"
    return Episode(id=f"sum:{place}:{first}-{last}", tick=last, text=text, significance=SUMMARY_SIGNIFICANCE)
