"""How the command line prints: run data escaped, decorated on a terminal, plain in a pipe.

- `printable(text)`: text from a run (a player's line echoed by an NPC, a model's reply, a
  prompt) as it may reach a terminal. C0 and C1 control characters, bidi controls and
  invisible characters are shown as escapes (`\\x1b`, `\\u202e`), so no escape sequence,
  reordering or hidden text reaches the screen raw. Every printer of the CLI goes through
  it (`Out` applies it to every piece of text it is given); `json_line` escapes the same
  characters in JSON's notation (`\\u001b`), so JSON Lines stay exact and still inert.
- `Out`: where a command prints its records. On a terminal rich decorates them (colour,
  tables, panels); when stdout is not a terminal nothing wraps and nothing is decorated:
  one record per line, fields separated by tabs, full ids and full text.
- `closed_pipe(exc)` and `silence_stdout()`: the reader of stdout went away (`| head -1`);
  the command ends quietly with exit status 0 (`sim.cli.main`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import msgspec
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sim.text import CONTROLS, LINE_BREAKS, UNSEEN

__all__ = ["Out", "Piece", "closed_pipe", "json_line", "printable", "silence_stdout"]

# What never reaches a terminal raw: C0 and C1 controls and DEL, every character that
# shows nothing (sim.text.UNSEEN: bidi and zero-width marks, soft hyphen, tags, ...), and
# the line and paragraph separators. A zero-width joiner between two pictographs is an
# emoji sequence and is left alone.
_PICTOGRAPH = "\u2600-\u27bf\U0001f000-\U0001faff"
_UNSEEN = re.compile(
    f"(?!(?<=[{_PICTOGRAPH}])\u200d[{_PICTOGRAPH}])(?:[{CONTROLS}{LINE_BREAKS}]|{UNSEEN.pattern})"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with every character that could act on a terminal shown as an escape.

    `lines=True` keeps line breaks (a prompt shown as the block it is); everything else of
    the set is escaped in both forms.
    """
    if lines:
        return "\n".join(_UNSEEN.sub(_escape, line) for line in text.split("\n"))
    return _UNSEEN.sub(_escape, text)


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


_JSON = msgspec.json.Encoder()


def json_line(value: Any) -> str:
    """`value` as one line of JSON with the characters `printable` escapes written as `\\uXXXX`.

    They can occur only inside JSON strings, where the escape means the same character: a
    reader gets the exact data back.
    """
    return _UNSEEN.sub(_json_escape, _JSON.encode(value).decode())


def closed_pipe(exc: BaseException) -> bool:
    """The reader of our output went away: a BrokenPipeError, alone or in a task group's error."""
    if isinstance(exc, BrokenPipeError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(closed_pipe(e) for e in exc.exceptions)
    return False


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that nothing written later (Python's own flush at exit) fails."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (a test's capture): nothing is flushed at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class _Console(Console):
    """A closed pipe is a BrokenPipeError for `sim.cli.main` to end quietly (rich would exit 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


Piece = str | tuple[str, str]
"""Part of a record: text, or (text, rich style) for the terminal."""


def _text(piece: Piece) -> str:
    return piece if isinstance(piece, str) else piece[0]


class Out:
    """Where a command prints: standard output (or `stream`), a terminal or not.

    `terminal` overrides the detection (tests). `flush=True` pushes every record out at
    once, for commands whose lines arrive over time (`run --follow`, `subscribe`).
    """

    def __init__(self, stream: TextIO | None = None, *, terminal: bool | None = None, flush: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self._flush = flush
        self.console = _Console(file=self.stream, force_terminal=self.terminal or None, highlight=False,
                                emoji=False)

    def _plain(self, text: str) -> None:
        self.stream.write(text + "\n")
        if self._flush:
            self.stream.flush()

    def record(self, *pieces: Piece) -> None:
        """One record on one line; styled pieces are styled on a terminal only."""
        parts = [(p, "") if isinstance(p, str) else p for p in pieces]
        if not self.terminal:
            self._plain("".join(printable(text) for text, _ in parts))
            return
        self.console.print(Text.assemble(*((printable(text), style) for text, style in parts)))

    def table(
        self,
        columns: Sequence[str],
        rows: Iterable[Sequence[Piece]],
        *,
        title: str | None = None,
        caption: str | None = None,
        right: Iterable[str] = (),
        whole: Iterable[str] = (),
        fold: bool = False,
        header: bool = False,
        stretch: str | None = None,
    ) -> None:
        """Rows under named columns: a rich table on a terminal, tab-separated lines in a pipe.

        In a pipe there is no title or caption, and a header line only with `header=True` (a
        report read by people, not a list of records: `--json` names the fields for programs).
        On a terminal, `right` names the columns aligned right, `whole` those never cut (ids),
        `stretch` the one that takes the width left (a text), and `fold` wraps long cells
        inside their column.
        """
        if not self.terminal:
            if header:
                self._plain("\t".join(columns))
            for row in rows:
                self._plain("\t".join(printable(_text(p)) for p in row))
            return
        cells = [[Text(printable(_text(p)), p[1] if isinstance(p, tuple) else "") for p in row] for row in rows]
        aligned, kept = set(right), set(whole)
        table = Table(title=title, title_justify="left", caption=caption, show_edge=False, show_lines=fold)
        for i, name in enumerate(columns):
            widest = max((len(line[i]) for line in cells), default=0) if name in kept else None
            table.add_column(name, justify="right" if name in aligned else "left", no_wrap=name in kept,
                             min_width=widest, overflow="fold" if fold else "ellipsis",
                             ratio=1 if name == stretch else None)
        for line in cells:
            table.add_row(*line)
        self.console.print(table)

    def block(self, title: str, text: str) -> None:
        """A multi-line text (a prompt) under a title: a panel on a terminal, the lines as they are in a pipe."""
        body = printable(text, lines=True)
        if self.terminal:
            self.console.print(Panel(Text(body), title=Text(printable(title)), expand=False))
            return
        self._plain(printable(title))
        self._plain(body)

    def json(self, value: Any) -> None:
        """One JSON Lines record."""
        self._plain(json_line(value))

    def blank(self) -> None:
        if self.terminal:
            self.console.print()
