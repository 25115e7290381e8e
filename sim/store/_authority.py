"""Who may write what, enforced in the store, not by convention (docs/store.md, "Authority").

| category | who may write |
|---|---|
| canonical facts | SCENARIO, GAME; added once (same id with other text refused), replaced or withdrawn by GAME only |
| world state | GAME (SCENARIO only when creating the agent) |
| episodic, beliefs, dialogue | NPC (SCENARIO/GAME only when creating the agent) |
| a new agent | SCENARIO, GAME |

Episodes and dialogue are append-only logs: an item is never changed in place. Beliefs
are kept one per id: a belief written again with its id (refreshed, revised) replaces the
older one, on disk and in the hot state, so the newest is the one kept, never a copy.
A refused write raises `AuthorityError`, is counted and is logged with its number.
"""

from __future__ import annotations

import enum
import logging
from typing import Literal, NoReturn

from sim.errors import AuthorityError

__all__ = ["WRITERS", "Authority", "Category", "Writer"]

log = logging.getLogger(__name__)


class Writer(enum.Enum):
    """Who is writing: the authority a write is checked against."""

    SCENARIO = "scenario"
    GAME = "game"
    NPC = "npc"


Category = Literal["agent", "canonical_facts", "world_state", "episodic", "beliefs", "dialogue"]
"""What a write changes; `agent` is creating one, with its whole initial state."""

WRITERS: dict[Category, frozenset[Writer]] = {
    "agent": frozenset({Writer.SCENARIO, Writer.GAME}),
    "canonical_facts": frozenset({Writer.SCENARIO, Writer.GAME}),
    "world_state": frozenset({Writer.GAME}),
    "episodic": frozenset({Writer.NPC}),
    "beliefs": frozenset({Writer.NPC}),
    "dialogue": frozenset({Writer.NPC}),
}
"""The table above: who may write each category."""


class Authority:
    """Checks writers against `WRITERS` and counts the violations since the store opened."""

    __slots__ = ("violations",)

    def __init__(self) -> None:
        self.violations = 0

    def check(self, agent_id: str, category: Category, writer: Writer) -> None:
        if writer not in WRITERS[category]:
            self.refuse(agent_id, category, writer)

    def refuse(self, agent_id: str, category: Category, writer: Writer, why: str = "") -> NoReturn:
        """Count, log and raise one violation; `why` says more than who wrote."""
        self.violations += 1
        message = f"agent {agent_id!r}: writer {writer.name} may not write {category}"
        if why:
            message = f"{message}: {why}"
        log.warning("authority violation #%d: %s", self.violations, message)
        raise AuthorityError(message)
