"""Output handling: turn a model's raw text into one spoken line, or reject it.

A line is one line of bounded length with stage directions (`*waves*`, `(sighs)`,
`[laughs]`), meta-text ("As an AI ...") and speaker prefixes ("Mara:", "Assistant:")
removed. A line is rejected when nothing is left, or when it negates a canonical fact kept
in the working memory. The negation check is deliberately simple: a fact's clause found in
the line with a negation inserted ("the bridge is not broken" against "The bridge is
broken"), or a negated fact's clause found without its negation.

Before anything else, escape sequences, control characters, bidi and zero-width marks are
removed (`sim.text`): the line goes to the public `say` topic, the audit and terminals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from sim.memory import Fact, WorkingMemory
from sim.text import without_controls

__all__ = ["Verdict", "clean_line", "contradicted_fact", "judge"]

_STAGE = re.compile(r"\*[^*\n]*\*|\([^)\n]*\)|\[[^\]\n]*\]")
_META = re.compile(
    r"\bas an? (?:ai|a\.i\.|language model|assistant|large language model)\b|\blanguage model\b|\bai assistant\b"
    r"|\bi(?:'m| am) (?:just )?an? ai\b|\bi cannot (?:role-?play|pretend)\b",
    re.IGNORECASE,
)
_META_SPEAKERS = ("assistant", "ai", "npc", "system", "response", "reply", "answer", "character", "bot")
_SENTENCE = re.compile(r"[^.!?]+[.!?]*")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,!?;:…])")
_WORD = re.compile(r"[a-z0-9']+")
_NEGATIONS = frozenset({"not", "never", "no", "nothing", "nobody", "nowhere", "neither", "nor"})
_CONTRACTIONS = {
    "can't": ["can", "not"],
    "cannot": ["can", "not"],
    "won't": ["will", "not"],
    "shan't": ["shall", "not"],
    "ain't": ["is", "not"],
}


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """The cleaned line and, when it is rejected, why and what to forbid on the retry."""

    line: str
    problem: str | None = None
    prohibition: str | None = None


def _strip_speakers(text: str, speakers: Iterable[str]) -> str:
    """Remove leading `Name:` prefixes (any known speaker, any case), repeatedly.

    Plain string comparison, not a regex built from the names: every NPC has its own
    names, so a compiled pattern per call (1-2 ms each) cost seconds per tick at 100,000 NPCs.
    """
    names = sorted({s.strip().lower() for s in speakers if s.strip()} | set(_META_SPEAKERS), key=len, reverse=True)
    while True:
        body = text.lstrip()
        for name in names:
            if body[: len(name)].lower() == name:
                rest = body[len(name) :].lstrip()
                if rest.startswith(":"):
                    text = rest[1:].lstrip()
                    break
        else:
            return text


def _bound(line: str, max_chars: int) -> str:
    if len(line) <= max_chars:
        return line
    cut = line[:max_chars]
    end = max(cut.rfind("."), cut.rfind("!"), cut.rfind("?"))
    if end >= max_chars // 2:
        return cut[: end + 1]
    space = cut[: max_chars - 1].rfind(" ")
    head = cut[: space if space > 0 else max_chars - 1].rstrip(" ,;:-")
    return head if head.endswith((".", "!", "?")) else head + "…"


def clean_line(raw: str, agent_id: str, max_chars: int, speakers: Iterable[str] = ()) -> str:
    """One bounded spoken line from raw model text; empty when nothing usable is left."""
    text = _STAGE.sub(" ", without_controls(raw))
    text = text.replace("*", " ")
    all_speakers = [agent_id, *speakers]
    for candidate in text.splitlines():
        line = _strip_speakers(candidate, all_speakers)
        sentences = [s.strip() for s in _SENTENCE.findall(line) if s.strip() and not _META.search(s)]
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(" ".join(sentences).split()))
        line = line.strip().strip('"“”').strip()
        if line and any(ch.isalnum() for ch in line):
            return _bound(line, max_chars)
    return ""


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


def judge(raw: str, memory: WorkingMemory, max_chars: int) -> Verdict:
    """Clean `raw` and decide whether the NPC may say it."""
    speakers = {line.speaker for line in memory.dialogue}
    line = clean_line(raw, memory.agent_id, max_chars, speakers)
    if not line:
        return Verdict(line="", problem="empty", prohibition="Answer with one short spoken line, in character.")
    fact = contradicted_fact(line, memory.canonical_facts)
    if fact is not None:
        return Verdict(
            line=line,
            problem=f"negates canonical fact {fact.id!r}",
            prohibition=f"Never deny or contradict this fact: {fact.text}",
        )
    return Verdict(line=line)
