"""A scenario's text cut at its tables, so that a world of a million NPCs is parsed a part at a time.

A TOML parser gives the whole document as one tree of dicts before anything is converted:
for a million NPCs with schedules that tree alone takes over 9 GB, far more than the
converted scenario. Cut at its table headers, the document is the rest (the scenario's own
tables) and its `[[npcs]]` tables, each with the sub-tables that follow it; parts of a few
thousand NPCs each then parse to dicts that are converted and dropped before the next.

Only a text that can be cut safely is cut: one without multi-line strings (a header-like
line inside one would be taken for a header) and with no `npcs` key outside its `[[npcs]]`
tables. Any other text, or any problem in a part, is parsed whole by the caller, which says
what is wrong with the file as it always does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = ["NPCS_PER_PART", "TextParts", "cut"]

NPCS_PER_PART = 5_000

_HEADER = re.compile(r"^[ \t]*\[\[?[ \t]*([A-Za-z0-9_.-]+)[ \t]*\]\]?[ \t]*(?:#[^\n]*)?$", re.MULTILINE)


class TextParts:
    """The rest of the document (every table but the NPCs'), and its NPC tables by part."""

    def __init__(self, text: str, rest: str, npcs: list[tuple[int, int]], per_part: int) -> None:
        self._text, self.rest, self._npcs, self._per_part = text, rest, npcs, per_part

    def npc_parts(self) -> Iterator[str]:
        """Each part's `[[npcs]]` tables as one TOML document, in the file's order."""
        text, npcs = self._text, self._npcs
        for first in range(0, len(npcs), self._per_part):
            spans = npcs[first:first + self._per_part]
            yield "\n".join(text[start:end] for start, end in spans)


def cut(text: str, per_part: int | None = None) -> TextParts | None:
    """The text cut at its table headers (`per_part` NPCs a part, NPCS_PER_PART by default),
    or None when it cannot be cut safely."""
    if '"""' in text or "'''" in text:
        return None
    headers = [(m.start(), m.group(1), m.group(0).lstrip().startswith("[[")) for m in _HEADER.finditer(text)]
    rest: list[str] = [text[:headers[0][0]] if headers else text]
    npcs: list[tuple[int, int]] = []
    for n, (start, name, array) in enumerate(headers):
        end = headers[n + 1][0] if n + 1 < len(headers) else len(text)
        if name == "npcs" and array:
            npcs.append((start, end))
        elif name.startswith("npcs.") and npcs:  # a sub-table of the NPC before it
            npcs[-1] = (npcs[-1][0], end)
        elif name == "npcs" or name.startswith("npcs."):
            return None
        else:
            rest.append(text[start:end])
    if re.search(r"^[ \t]*npcs[ \t]*=", rest[0], re.MULTILINE):
        return None
    return TextParts(text, "".join(rest), npcs, per_part or NPCS_PER_PART)
