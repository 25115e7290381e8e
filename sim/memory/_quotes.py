"""Quoting what someone said without ever quoting a quote.

An NPC remembers a line as `who said to whom: "the line"`, and a line may itself hold a
quotation: a player's `Declare "Soviet Snack Day"`, or an NPC retelling what it remembers.
Quoting such a line whole nests the quotes one level per retelling, and the memories of a
long conversation grow without bound (`said: "I remember: x said: "..."."`). `own_words`
keeps only the speaker's own words, each quoted passage cut to an ellipsis, so a memory
or a reply made with `quoted` holds exactly one level of quotes, however often it is
retold. Pure text, no I/O.
"""

from __future__ import annotations

import functools
import re

__all__ = ["QUOTE_MARKS", "own_words", "quoted"]

QUOTE_MARKS = '"\u201c\u201d\u201e\u201f\u00ab\u00bb'
"""The double quotation marks: straight, curly (open, close, low, reversed) and guillemets.
Apostrophes and single quotes are not among them: they are in every contraction."""

_PASSAGE = re.compile('"[^"]*"|\u201c[^\u201d]*\u201d|\u201e[^\u201c\u201d]*[\u201c\u201d]|\u00ab[^\u00bb]*\u00bb')
_MARK = re.compile(f"[{QUOTE_MARKS}]")
_ELLIPSIS = "\u2026"
_BEFORE_PUNCTUATION = re.compile(f"{_ELLIPSIS} (?=[.,;:!?])")


@functools.lru_cache(maxsize=65536)  # an NPC's dialogue lines are compared again at each of its turns
def own_words(text: str) -> str:
    """`text` with every quoted passage replaced by an ellipsis, stray quote marks removed and
    whitespace collapsed; an ellipsis when nothing of the speaker's own is left."""
    words = " ".join(_MARK.sub(" ", _PASSAGE.sub(f" {_ELLIPSIS} ", text)).split())
    return _BEFORE_PUNCTUATION.sub(_ELLIPSIS, words) or _ELLIPSIS


def quoted(text: str) -> str:
    """`text` in quotation marks, one level: its own words only (`own_words`)."""
    return f'"{own_words(text)}"'
