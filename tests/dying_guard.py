"""A fact guard that ends the process it runs in: the worker-process tests' fault.

`once`: the process dies (exit code 9) at its first line while the file named by
NPCSIM_TEST_DIE_ONCE exists, which it removes first, so the next process serves; otherwise
it is the built-in guard. `always`: every process dies at its first line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from sim.memory import Fact
from sim.output import contradicted_fact

__all__ = ["always", "once"]


def once(line: str, facts: Sequence[Fact]) -> Fact | None:
    marker = Path(os.environ["NPCSIM_TEST_DIE_ONCE"])
    if marker.exists():
        marker.unlink()
        os._exit(9)
    return contradicted_fact(line, facts)


def always(line: str, facts: Sequence[Fact]) -> Fact | None:
    os._exit(9)
