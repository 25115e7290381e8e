"""The first fact guard, as the output check had it before the built-in guard of sim.inference.

A plug-in guard (`RunConfig(fact_guard="tests.first_fact_guard:contradicted_fact")`) for a
test that continues a store written by the engine of that time. It rejects some lines that
only restate a fact, as that engine did (a fact whose clause begins with its negation, said
word for word: "Every snack costs money; nothing is ever free."), so the continuation says
what tests/golden/audit-village-guard1.tsv holds. Copied unchanged from
sim/inference/_output.py of that time (its `contradicted_fact` and helpers).

Its rule: a fact's clause found in the line with a negation inserted ("the bridge is not
broken" against "The bridge is broken"), or a negated fact's clause found without its
negation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sim.memory import Fact

__all__ = ["contradicted_fact"]

_WORD = re.compile(r"[a-z0-9']+")
_NEGATIONS = frozenset({"not", "never", "no", "nothing", "nobody", "nowhere", "neither", "nor"})
_CONTRACTIONS = {
    "can't": ["can", "not"],
    "cannot": ["can", "not"],
    "won't": ["will", "not"],
    "shan't": ["shall", "not"],
    "ain't": ["is", "not"],
}


def _words(text: str) -> list[str]:
    words: list[str] = []
    for word in _WORD.findall(text.lower().replace("\u2019", "'")):
        if word in _CONTRACTIONS:
            words.extend(_CONTRACTIONS[word])
        elif word.endswith("n't"):
            words.extend([word[:-3], "not"])
        else:
            words.append(word)
    return words


def _clauses(text: str) -> list[list[str]]:
    parts = re.split(r"[,.;:!?]|\bbut\b|\band\b", text, flags=re.IGNORECASE)
    return [w for w in (_words(p) for p in parts) if len(w) >= 2]


def _negates(line: list[str], clause: list[str]) -> bool:
    """The clause appears in the line with its negation flipped, words otherwise in order."""
    core = [w for w in clause if w not in _NEGATIONS]
    clause_negated = len(core) != len(clause)
    if len(core) < 2:
        return False
    for start in range(len(line)):
        if line[start] != core[0]:
            continue
        i, j, negations = start, 0, 0
        while i < len(line) and j < len(core):
            if line[i] == core[j]:
                j += 1
            elif line[i] in _NEGATIONS:
                negations += 1
            else:
                break
            i += 1
        if j == len(core) and (negations > 0) != clause_negated:
            return True
    return False


def contradicted_fact(line: str, facts: Iterable[Fact]) -> Fact | None:
    """The first kept canonical fact the line negates, if any."""
    words = _words(line)
    for fact in facts:
        if any(_negates(words, clause) for clause in _clauses(fact.text)):
            return fact
    return None
