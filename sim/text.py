"""Characters that are not text: terminal escape sequences, control characters, bidi and
zero-width marks, and other characters that show nothing (docs/working-memory.md, "Untrusted
text is inert").

Text that came from outside (a model's reply, a player's words) carries them to whatever
shows it: an ESC sequence clears a terminal, U+202E turns a line around, U+200B hides a
marker from a filter. They are defined here once, for every place that keeps them out:

- `INVISIBLE` (zero-width and bidi marks) is removed from text that is kept: the line an
  NPC says (`without_controls`: the public `say` topic, the audit) and untrusted text in
  the prompt (`sim.memory.render.inert`). It stays this narrow set because the prompt's
  rendering is a recorded contract (`RENDERER_VERSION`): what it removes decides the
  prompts a recorded run replays, so a wider set would be a new renderer.
- `UNSEEN` is `INVISIBLE` and the blanks: soft hyphen, combining grapheme joiner, Hangul
  fillers, the deprecated format controls, interlinear annotation marks and tag
  characters. It is for what is compared or shown, never kept: the fact guard drops them
  before it reads words (one inside a word must not hide a denial) and the terminal shows
  them as escapes (`sim.cli`).
- `CONTROLS`: C0 and C1 controls and DEL, and `LINE_BREAKS`, as character classes:
  `without_controls` removes the controls but the line breaks, the prompt's rendering
  shows a line break as a visible "\\n" and another control as a space, the terminal
  escapes them all.

Pure: no I/O.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "CONTROLS", "INVISIBLE", "LINE_BREAKS", "UNSEEN", "fold", "remove_invisible", "remove_unseen", "without_controls",
]

_ZERO_WIDTH = "\u180e\u200b-\u200d\u2060-\u2064\ufeff"
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_BLANKS = "\u00ad\u034f\u115f\u1160\u206a-\u206f\u3164\ufff9-\ufffb\uffa0\U000e0000-\U000e007f"

INVISIBLE = re.compile(f"[{_ZERO_WIDTH}{_BIDI}]")
"""Zero-width and bidi controls: ZWSP, ZWNJ, ZWJ, LRM, RLM, the embeddings and overrides
(U+202A..U+202E), word joiner and invisible operators, the isolates (U+2066..U+2069), the
BOM, the Arabic letter mark and the Mongolian vowel separator."""

UNSEEN = re.compile(f"[{_ZERO_WIDTH}{_BIDI}{_BLANKS}]")
"""`INVISIBLE` and the characters that show nothing: soft hyphen, combining grapheme joiner,
the Hangul fillers (U+115F, U+1160, U+3164, U+FFA0), the deprecated format controls
(U+206A..U+206F), the interlinear annotation marks (U+FFF9..U+FFFB), the tags (U+E0000..U+E007F)."""

CONTROLS = "\x00-\x1f\x7f-\x9f"
"""C0 controls, DEL and C1 controls: the body of a regular expression's character class."""

LINE_BREAKS = "\n\v\f\r\x1c-\x1e\x85\u2028\u2029"
"""The line breaks of str.splitlines, all but the last two controls: a character class's body."""

# ECMA-48: a CSI sequence (ESC [ or C1 CSI, parameters, intermediates, a final byte); an
# OSC, DCS, SOS, PM or APC string up to its terminator (BEL, ST) or the end; any other
# two-byte ESC sequence. Removed whole, so that no "[31m" is left behind.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d-\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
# The controls but the line breaks and the tab.
_CONTROLS_IN_LINES = re.compile(f"(?![\t{LINE_BREAKS}])[{CONTROLS}]")


def remove_invisible(text: str) -> str:
    """`text` without zero-width and bidi controls."""
    return INVISIBLE.sub("", text)


def remove_unseen(text: str) -> str:
    """`text` without any character that shows nothing (`UNSEEN`)."""
    return UNSEEN.sub("", text)


def without_controls(text: str) -> str:
    """`text` with no escape sequence, control character, bidi or zero-width mark.

    Line breaks stay (the caller decides what a line is); a tab becomes a space.
    """
    text = _ESCAPE_SEQUENCE.sub("", text).replace("\t", " ")
    return remove_invisible(_CONTROLS_IN_LINES.sub("", text))


# Letters that look like Latin ones (Unicode's confusables for the Latin alphabet, the
# common part): Cyrillic and Greek, lower and upper case.
_LOOKALIKE = str.maketrans({
    # Cyrillic (and the Latin script's own g-like U+0261)
    "\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0440": "p", "\u0441": "c", "\u0445": "x", "\u0443": "y",
    "\u0456": "i", "\u0457": "i", "\u0458": "j", "\u0455": "s", "\u0501": "d", "\u051b": "q", "\u051d": "w",
    "\u04bb": "h", "\u04cf": "l", "\u0261": "g", "\u0410": "A", "\u0412": "B", "\u0415": "E", "\u041a": "K",
    "\u041c": "M", "\u041d": "H", "\u041e": "O", "\u0420": "P", "\u0421": "C", "\u0422": "T", "\u0425": "X",
    "\u0423": "Y", "\u0406": "I", "\u0408": "J", "\u0405": "S", "\u050c": "G",
    # Greek
    "\u03b1": "a", "\u03bf": "o", "\u03b5": "e", "\u03c1": "p", "\u03b9": "i", "\u03bd": "v", "\u03ba": "k",
    "\u03c4": "t", "\u03c5": "u", "\u03c7": "x", "\u0391": "A", "\u0392": "B", "\u0395": "E", "\u0396": "Z",
    "\u0397": "H", "\u0399": "I", "\u039a": "K", "\u039c": "M", "\u039d": "N", "\u039f": "O", "\u03a1": "P",
    "\u03a4": "T", "\u03a5": "Y", "\u03a7": "X",
})
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2032": "'", "`": "'"})
# Digits written for letters ("n0t", "c3llar k3y"), read back in a word that has a letter too;
# a number ("1200") or an ordinal ("3rd") is left as it is.
_DIGIT_LETTERS = str.maketrans("013457", "oieast")
_MIXED_WORD = re.compile(r"\b(?=\w*[^\W\d_])(?=\w*\d)\w+")
_ORDINAL = re.compile(r"\d+(?:st|nd|rd|th)")


def _letters_for_digits(match: re.Match[str]) -> str:
    word = match.group(0)
    return word if _ORDINAL.fullmatch(word) else word.translate(_DIGIT_LETTERS)


def fold(text: str) -> str:
    """`text` as it is compared, never kept: NFKC, `UNSEEN` removed, look-alike Cyrillic and Greek
    letters mapped to the Latin ones, accents dropped, case folded, apostrophes straightened
    (the fact guard reads words this way, the knowledge boundaries match phrases so), digits
    written for letters read as the letters ("n0t" is "not")."""
    if not text.isascii():  # else nothing to compose, remove, map or strip of accents
        text = remove_unseen(unicodedata.normalize("NFKC", text)).translate(_LOOKALIKE)
        text = "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))
    text = text.casefold().translate(_APOSTROPHES)
    return _MIXED_WORD.sub(_letters_for_digits, text) if any(c.isdigit() for c in text) else text
