"""The one definition of characters that are not text (sim.text), and every user of it agreeing:
the line said and the prompt drop INVISIBLE, the fact guard reads past UNSEEN, the terminal
shows UNSEEN and every control as an escape."""

from __future__ import annotations

import json
import re

import pytest

from sim.cli._terminal import json_line, printable
from sim.memory import Fact, inert
from sim.output import contradicted_fact
from sim.text import CONTROLS, INVISIBLE, LINE_BREAKS, UNSEEN, remove_unseen, without_controls

UNSEEN_CHARS = [chr(c) for c in range(0x110000) if UNSEEN.fullmatch(chr(c))]
INVISIBLE_CHARS = [c for c in UNSEEN_CHARS if INVISIBLE.fullmatch(c)]
CONTROL_CHARS = [chr(c) for c in range(0x100) if 0 <= c < 0x20 or 0x7F <= c < 0xA0]


def test_the_sets() -> None:
    assert len(INVISIBLE_CHARS) == 22 and len(UNSEEN_CHARS) == 22 + 15 + 128
    assert {"\u200b", "\u200d", "\u202e", "\u2066", "\ufeff", "\u061c"} <= set(INVISIBLE_CHARS)
    assert {"\u00ad", "\u034f", "\u3164", "\u206a", "\ufffb", "\U000e0041"} <= set(UNSEEN_CHARS) - set(INVISIBLE_CHARS)
    everything = "".join(map(chr, range(0x110000)))
    assert re.findall(f"[{CONTROLS}]", everything) == CONTROL_CHARS
    assert re.findall(f"[{LINE_BREAKS}]", everything) == [c for c in everything if len(f"a{c}b".splitlines()) == 2]


@pytest.mark.parametrize("char", UNSEEN_CHARS, ids=lambda c: f"U+{ord(c):04X}")
def test_each_user_of_an_unseen_character(char: str) -> None:
    text = f"pay{char}me"
    # kept text (the line said, the prompt) loses INVISIBLE, and the rest of UNSEEN stays: the
    # prompt's rendering is a recorded contract
    kept = "payme" if char in INVISIBLE_CHARS else text
    assert without_controls(text) == kept and inert(text) == kept
    # the fact guard reads past every one of them
    assert remove_unseen(text) == "payme"
    assert contradicted_fact(f"The king is n{char}ot de{char}ad.", [Fact(id="f", text="The king is dead.")])
    # the terminal shows every one as an escape, in JSON too, and the JSON is the same data
    assert char not in printable(text) and char not in printable(text, lines=True)
    assert char not in json_line(text) and json.loads(json_line(text)) == text


@pytest.mark.parametrize("char", CONTROL_CHARS, ids=lambda c: f"U+{ord(c):04X}")
def test_each_user_of_a_control_character(char: str) -> None:
    text = f"a{char}"  # at the end: an ESC or a C1 control may begin a sequence, removed whole
    assert char not in printable(text) and char not in json_line(text)
    if re.match(f"[{LINE_BREAKS}]", char):
        assert without_controls(text) == text  # the caller decides what a line is
    elif char == "\t":
        assert without_controls(text) == "a "
    else:
        assert without_controls(text) == "a"


def test_an_emoji_sequence_keeps_its_joiner_on_a_terminal_only() -> None:
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    assert printable(family) == family
    assert without_controls(family) == remove_unseen(family) == "\U0001f468\U0001f469\U0001f467"
