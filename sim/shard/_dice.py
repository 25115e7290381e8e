"""The ambient dice: which NPCs talk unprompted this tick, rolled by the shard in one tight loop.

An NPC's roll for a tick is `ambient_roll(seed, id, tick)`, a uniform draw in [0, 1), and it
talks when the roll is below its `ambient_chance`: a function of (seed, id, tick), so a
resumed run rolls what the uninterrupted one did. The shard decides who takes a turn, so
an NPC that has no mail and whose dice do not fall is never touched; the roll itself is the
one cost every NPC still pays each tick (docs/scaling.md). `AmbientDice` keeps what the
roll needs as a table (the `f"{seed}:{id}:"` prefix of each NPC whose chance is above 0,
and the chance) and rolls it in slices, so the event loop gets its turn between them.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable

from sim.scenario import NpcSpec

__all__ = ["AmbientDice", "ambient_roll"]

_SCALE = 2**64


def ambient_roll(seed: int, agent_id: str, tick: int) -> float:
    """A uniform draw in [0, 1) for the agent's ambient dice in `tick`."""
    digest = hashlib.blake2b(f"{seed}:{agent_id}:{tick}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


class AmbientDice:
    """The dice of many NPCs; `roll(tick, start, stop)` rolls a slice of them.

    NPCs whose chance is 0 are left out: their dice never fall.
    """

    __slots__ = ("_chances", "_ids", "_prefixes")

    def __init__(self, seed: int, specs: Iterable[NpcSpec]) -> None:
        talking = [spec for spec in specs if spec.ambient_chance > 0]
        self._ids = [spec.id for spec in talking]
        self._prefixes = [f"{seed}:{spec.id}:".encode() for spec in talking]
        self._chances = array("d", (spec.ambient_chance for spec in talking))

    def __len__(self) -> int:
        """How many NPCs roll."""
        return len(self._ids)

    def roll(self, tick: int, start: int = 0, stop: int | None = None) -> list[str]:
        """The ids, among the NPCs `start` to `stop` of the table, whose dice fall in `tick`.

        The same draws as `ambient_roll`, compared the same way (`draw < chance`).
        """
        suffix = str(tick).encode()
        blake2b, from_bytes = hashlib.blake2b, int.from_bytes
        prefixes, chances, ids = self._prefixes, self._chances, self._ids
        fallen = []
        for k in range(start, len(ids) if stop is None else min(stop, len(ids))):
            if from_bytes(blake2b(prefixes[k] + suffix, digest_size=8).digest(), "big") / _SCALE < chances[k]:
                fallen.append(ids[k])
        return fallen
