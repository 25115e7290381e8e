"""Output handling: turn a model's raw text into one spoken line, or reject it.

A line is one line of bounded length with stage directions (`*waves*`, `(sighs)`,
`[laughs]`), meta-text ("As an AI ...") and speaker prefixes ("Mara:", "Assistant:")
removed. A line is rejected when nothing is left, or when the fact guard says it
contradicts a canonical fact kept in the working memory. The guard is a parameter
(`FactGuard`, sim.output.guard): the built-in `contradicted_fact` by default, or a
stronger one (an NLI model, a second model call) that a user plugs in.

Before anything else, escape sequences, control characters, bidi and zero-width marks are
removed (`sim.text`): the line goes to the public `say` topic, the audit and terminals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from sim.memory import QUOTE_MARKS, WorkingMemory
from sim.output.guard import FactGuard
from sim.text import without_controls
from sim.wire.attempt import ProposalVerdict

__all__ = ["Verdict", "clean_line", "judge_line"]

_STAGE = re.compile(r"\*[^*\n]*\*|\([^)\n]*\)|\[[^\]\n]*\]")
_META = re.compile(
    r"\bas an? (?:ai|a\.i\.|language model|assistant|large language model)\b|\blanguage model\b|\bai assistant\b"
    r"|\bi(?:'m| am) (?:just )?an? ai\b|\bi cannot (?:role-?play|pretend)\b",
    re.IGNORECASE,
)
_META_SPEAKERS = ("assistant", "ai", "npc", "system", "response", "reply", "answer", "character", "bot")
# A sentence keeps the closing quote that follows its end (`... said: "Go." Then`), so
# joining sentences never puts a space before a closing quote.
_SENTENCE = re.compile(f"[^.!?]+[.!?]*[{QUOTE_MARKS}]?")
# Not before an ellipsis: one that stands for words left out has a space before it ("said: … and").
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,!?;:])")


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """The cleaned line and, when it is rejected, why (`code`, sim.output's verdict codes, and
    `problem`) and what to forbid on the retry. `proposals`: the gates' verdicts on each part
    of a reply judged under an output policy (sim.output.judge)."""

    line: str
    problem: str | None = None
    prohibition: str | None = None
    code: str = "ok"
    proposals: tuple[ProposalVerdict, ...] = ()


def _strip_speakers(text: str, speakers: Iterable[str]) -> str:
    """Remove leading `Name:` prefixes (any known speaker, any case), repeatedly.

    Plain string comparison, not a regex built from the names: every NPC has its own
    names, and compiling a pattern per call would cost more than the whole check.
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


def _unwrapped(line: str) -> str:
    """The line without quotation marks around it all (a model quoting its own line), or
    without a stray mark at either end; a quotation inside it keeps both its marks."""
    marks = sum(line.count(mark) for mark in QUOTE_MARKS)
    if marks == 2 and len(line) > 1 and line[0] in QUOTE_MARKS and line[-1] in QUOTE_MARKS:
        return line[1:-1].strip()
    if marks % 2:
        return line.strip(QUOTE_MARKS).strip()
    return line


def clean_line(raw: str, agent_id: str, max_chars: int, speakers: Iterable[str] = ()) -> str:
    """One bounded spoken line from raw model text; empty when nothing usable is left."""
    text = _STAGE.sub(" ", without_controls(raw))
    text = text.replace("*", " ")
    all_speakers = [agent_id, *speakers]
    for candidate in text.splitlines():
        line = _strip_speakers(candidate, all_speakers)
        sentences = [s.strip() for s in _SENTENCE.findall(line) if s.strip() and not _META.search(s)]
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(" ".join(sentences).split()))
        line = _unwrapped(line.strip())
        if line and any(ch.isalnum() for ch in line):
            return _bound(line, max_chars)
    return ""


def judge_line(raw: str, memory: WorkingMemory, max_chars: int, guard: FactGuard) -> Verdict:
    """Clean `raw` and decide whether the NPC may say it; `guard` finds a contradicted fact."""
    speakers = {line.speaker for line in memory.dialogue}
    line = clean_line(raw, memory.agent_id, max_chars, speakers)
    if not line:
        return Verdict(line="", problem="empty", prohibition="Answer with one short spoken line, in character.",
                       code="empty")
    fact = guard(line, memory.canonical_facts)
    if fact is not None:
        return Verdict(
            line=line,
            problem=f"negates canonical fact {fact.id!r}",
            prohibition=f"Never deny or contradict this fact: {fact.text}",
            code="canonical_fact",
        )
    return Verdict(line=line)
