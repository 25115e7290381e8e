"""What a scenario's schema error says: the file and line, the NPC or player, the field, and
a field of that table the unknown one may have meant."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

__all__ = ["schema_error"]


def schema_error(source: str, text: str, raw: dict[str, Any], message: str, root: type[msgspec.Struct]) -> str:
    """One line for msgspec's `message` about converting `raw` (parsed from `text`) to `root`."""
    path = _path(message)
    line = _line_of(text, path, _unknown_field(message))
    where = f"{source}:{line}" if line is not None else source
    return f"{where}: {_locate(raw, message)}{_did_you_mean(path, message, root)}"


_PATH = re.compile(r"`\$\.(npcs|players)\[(\d+)\]([^`]*)`")
_AT = re.compile(r"- at `\$([^`]*)`")
_SEGMENT = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?")


def _locate(raw: dict[str, Any], message: str) -> str:
    """Name the NPC or player a msgspec error path points into."""
    match = _PATH.search(message)
    if not match:
        return message
    group, index = match.group(1), int(match.group(2))
    entries = raw.get(group, [])
    who = entries[index].get("id") if index < len(entries) and isinstance(entries[index], dict) else None
    noun = "npc" if group == "npcs" else "player"
    field = match.group(3).lstrip(".") or "(the entry itself)"
    return f"{noun} {who!r} ({group}[{index}]), field {field}: {message}"


def _path(message: str) -> list[str | int]:
    """The segments of the path a msgspec error names: `$.npcs[1].tick` -> ["npcs", 1, "tick"]."""
    match = _AT.search(message)
    if match is None:
        return []
    return [name if name else int(index) for name, index in _SEGMENT.findall(match.group(1))]


def _unknown_field(message: str) -> str | None:
    match = _UNKNOWN.search(message)
    return match.group(1) if match else None


def _struct_at(path: Sequence[str | int], root: type[msgspec.Struct]) -> type[msgspec.Struct] | None:
    """The Struct type the scenario schema (`root`) has at `path` (list items included), or None."""
    kind: Any = root
    for segment in path:
        if isinstance(segment, str):
            if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)):
                return None
            fields = {f.encode_name: f.type for f in msgspec.structs.fields(kind)}
            if segment not in fields:
                return None
            kind = fields[segment]
        while typing.get_origin(kind) is Annotated:
            kind = typing.get_args(kind)[0]
        if isinstance(segment, int) or typing.get_origin(kind) in (list, tuple):
            args = typing.get_args(kind)
            kind = args[0] if args and isinstance(segment, int) else kind
    return kind if isinstance(kind, type) and issubclass(kind, msgspec.Struct) else None


def _did_you_mean(path: Sequence[str | int], message: str, root: type[msgspec.Struct]) -> str:
    """"; did you mean `x`?" for an unknown field close to a known one of its table."""
    field = _unknown_field(message)
    kind = _struct_at(path, root)
    if field is None or kind is None:
        return ""
    names = [f.encode_name for f in msgspec.structs.fields(kind)]
    close = difflib.get_close_matches(field, names, n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else f"; the fields here: {', '.join(names)}"


def _line_of(text: str, path: Sequence[str | int], field: str | None) -> int | None:
    """The line (1-based) of the TOML table or key a schema error's path points to, when it can be found.

    Tables and arrays of tables are followed by their headers (`[[npcs]]` n times); inside
    the table the key is the path's next name, or the unknown field itself.
    """
    lines = text.splitlines()
    start, end = 0, len(lines)  # the part of the file searched: the whole file, then one table
    rest = list(path)
    found: int | None = None
    if rest and isinstance(rest[0], str):
        name = rest.pop(0)
        index = rest.pop(0) if rest and isinstance(rest[0], int) else 0
        headers = [i for i, line in enumerate(lines) if (m := _HEADER.match(line)) and m.group(2) == name]
        if index < len(headers):
            start = found = headers[index]
            end = next((i for i in range(start + 1, len(lines)) if _HEADER.match(lines[i])), len(lines))
        else:  # a key of the top level, before the first table
            end = next((i for i, line in enumerate(lines) if _HEADER.match(line)), len(lines))
            rest.insert(0, name)
    key = next((s for s in rest if isinstance(s, str)), field)
    if key is not None:
        pattern = re.compile(rf"^\s*{re.escape(key)}\s*=|^\s*\[\[?\s*{re.escape(key)}\s*\]")
        found = next((i for i in range(start, end) if pattern.match(lines[i])), found)
    return None if found is None else found + 1
