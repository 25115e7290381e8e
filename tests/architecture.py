"""docs/architecture.md's import table, generated from the code's imports.

    python -m tests.architecture            # print the table
    python -m tests.architecture --write    # replace it in docs/architecture.md, between its markers

One row per room (each package of sim and each top-level module, and `agents`), by depth
(a room that imports none of the others first, then each after every room it imports, ties
by name): the rooms it imports, in that order too, "(type checking)" after one imported
only under `if TYPE_CHECKING:`. `sim.errors`, imported everywhere, is left out.
tests/test_docs.py checks that the page holds what this generates; the imports are read
as tests/test_layout.py reads them.
"""

from __future__ import annotations

import sys

from tests.helpers import REPO
from tests.test_layout import MODULES, edges

__all__ = ["BEGIN", "END", "PAGE", "import_table", "room_imports", "write"]

BEGIN = "<!-- imports:begin -->"
END = "<!-- imports:end -->"
PAGE = REPO / "docs" / "architecture.md"
LEFT_OUT = ("sim.errors",)


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "agents":
        return "agents"
    if parts[0] == "sim" and len(parts) > 1:
        room = ".".join(parts[:2])
        return None if room in LEFT_OUT else room
    return None


def room_imports() -> dict[str, dict[str, bool]]:
    """For each room, the rooms it imports, each with whether only type checking imports it."""
    found: dict[str, dict[str, bool]] = {}
    for module in sorted(MODULES):
        if (room := _room(module)) is None:
            continue
        row = found.setdefault(room, {})
        at_run_time = {_room(t) for t, _, _ in edges(module)}
        for target, _, _ in edges(module, type_checking=True):
            if (other := _room(target)) is not None and other != room:
                row[other] = row.get(other, True) and other not in at_run_time
    return found


def _order(graph: dict[str, dict[str, bool]]) -> list[str]:
    """The rooms by depth (0: importing none of the others; else one more than the deepest
    room imported), ties by name: each after every room it imports."""
    depth: dict[str, int] = {}

    def deep(room: str, seen: tuple[str, ...] = ()) -> int:
        if room not in depth:
            below = [deep(t, (*seen, room)) for t in graph.get(room, {}) if t not in seen]  # a circle: cut
            depth[room] = 1 + max(below, default=-1)
        return depth[room]

    return sorted(graph, key=lambda room: (deep(room), room))


def import_table() -> str:
    """The table with its markers, as docs/architecture.md holds it."""
    graph = room_imports()
    order = _order(graph)
    rows = [BEGIN, "| package | imports |", "|---|---|"]
    for room in order:
        named = [f"`{t}`" + (" (type checking)" if graph[room][t] else "")
                 for t in sorted(graph[room], key=order.index)]
        rows.append(f"| `{room}` | {', '.join(named) or 'nothing of sim'} |")
    return "\n".join([*rows, END]) + "\n"


def write() -> None:
    """Replace the table between the markers of docs/architecture.md."""
    text = PAGE.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END) + 1
    PAGE.write_text(text[:start] + import_table() + text[end:])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(import_table())
