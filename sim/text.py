"""Characters that are not text: terminal escape sequences, control characters, bidi and
zero-width marks (DESIGN.md, "Trust boundary").

Text that came from outside (a model's reply, a player's words) carries them to whatever
shows it: an ESC sequence clears a terminal, U+202E turns a line around, U+200B hides a
marker from a filter. One definition here, for every place that keeps them out: output
handling (the line an NPC says, on the public `say` topic and in the audit) and the
prompt's rendering of untrusted text (`sim.memory.render.inert`). Pure: no I/O.
"""

from __future__ import annotations

import re

__all__ = ["INVISIBLE", "remove_invisible", "without_controls"]

INVISIBLE = re.compile("[\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
"""Zero-width and bidi controls: ZWSP, ZWNJ, ZWJ, LRM, RLM, the embeddings and overrides
(U+202A..U+202E), word joiner and invisible operators, the isolates (U+2066..U+2069), the
BOM, the Arabic letter mark and the Mongolian vowel separator."""

# ECMA-48: a CSI sequence (ESC [ or C1 CSI, parameters, intermediates, a final byte); an
# OSC, DCS, SOS, PM or APC string up to its terminator (BEL, ST) or the end; any other
# two-byte ESC sequence. Removed whole, so that no "[31m" is left behind.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d-\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
# C0 controls, DEL and C1 controls, except the line breaks of str.splitlines (\n \r \v \f
# \x1c-\x1e \x85) and the tab (a space).
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f]")


def remove_invisible(text: str) -> str:
    """`text` without zero-width and bidi controls."""
    return INVISIBLE.sub("", text)


def without_controls(text: str) -> str:
    """`text` with no escape sequence, control character, bidi or zero-width mark.

    Line breaks stay (the caller decides what a line is); a tab becomes a space.
    """
    text = _ESCAPE_SEQUENCE.sub("", text).replace("\t", " ")
    return remove_invisible(_CONTROLS.sub("", text))
