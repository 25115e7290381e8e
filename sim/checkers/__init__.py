"""The independent checkers: oracles that trust nothing the code they check says of itself.

- `check_working_memory` (sim.checkers.memory): a working memory against its invariants
  (I1-I8, docs/working-memory.md), re-derived from the state on its own;
- `check_proposals` (sim.checkers.proposals): the gates' accepted verdicts read again with
  rules written apart from the gates (docs/npc-output.md);
- `Violation` (sim.checkers.violation): what either found.

Tests use them as oracles; `npcsim loadtest` runs them on every snapshot and attempt. Pure:
they import sim.memory and sim.output, never an I/O layer.
"""

from sim.checkers.memory import check_working_memory
from sim.checkers.proposals import check_proposals
from sim.checkers.violation import Violation

__all__ = ["Violation", "check_proposals", "check_working_memory"]
