"""Speaker prefixes are stripped exactly as the former regex did, without compiling one per call."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from sim.output.line import _META_SPEAKERS, _strip_speakers


def regex_strip(text: str, speakers: list[str]) -> str:
    """The former implementation, kept here as the reference."""
    names = sorted({s.strip() for s in speakers if s.strip()} | set(_META_SPEAKERS), key=len, reverse=True)
    pattern = re.compile(r"^\s*(?:" + "|".join(re.escape(n) for n in names) + r")\s*:\s*", re.IGNORECASE)
    previous = None
    while previous != text:
        previous = text
        text = pattern.sub("", text)
    return text


names = st.text(alphabet="abcABC :.\t-", min_size=0, max_size=6)
texts = st.lists(st.sampled_from(["ab", "AB", "a", " ", ":", "Npc", "npc :", "bot:", "x", "\n", "ai"]), max_size=12)


@given(st.lists(names, max_size=4), texts)
def test_same_result_as_the_regex(speakers: list[str], parts: list[str]) -> None:
    text = "".join(parts)
    assert _strip_speakers(text, speakers) == regex_strip(text, speakers)


def test_examples() -> None:
    assert _strip_speakers("Mara: NPC : Hello there.", ["Mara"]) == "Hello there."
    assert _strip_speakers("  mara :  Hi", ["Mara"]) == "Hi"
    assert _strip_speakers("Marathon: runs", ["Mara"]) == "Marathon: runs"
    assert _strip_speakers(" Hello: there", []) == " Hello: there"
