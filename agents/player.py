"""Players that live inside a shard: scripted ones from the scenario, bots for load.

A player's input becomes a `Speech` event with `from_player=True`; the shard publishes
it on the addressed NPC's location (when the player stands there, so others overhear)
or inbox. Players from outside send JSON on `player/{id}/input` instead; see sim.shard.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from agents.personas import BOT_LINES
from sim.scenario import PlayerSpec
from sim.wire.events import Speech, event_id

__all__ = ["BotPlayer", "ScriptedPlayer"]


class ScriptedPlayer:
    """Says the scenario's script lines at their ticks."""

    def __init__(self, spec: PlayerSpec, run_id: str) -> None:
        self.id = spec.id
        self.location = spec.location
        self._run = run_id
        self._script: dict[int, list[tuple[str, str]]] = {}
        for line in spec.script:
            self._script.setdefault(line.tick, []).append((line.to, line.text))

    def inputs(self, tick: int) -> list[Speech]:
        return [
            Speech(
                id=event_id(self._run, self.id, tick, seq),
                tick=tick,
                location=self.location,
                speaker=self.id,
                to=to,
                text=text,
                from_player=True,
            )
            for seq, (to, text) in enumerate(self._script.get(tick, ()))
        ]


class BotPlayer:
    """A load-test player: each tick, with probability `rate`, says a stock line to an NPC.

    Its draws are a function of (seed, id, tick), so a resumed run's bots say what the
    uninterrupted run's did."""

    def __init__(self, player_id: str, npcs: Sequence[str], run_id: str, seed: int, rate: float) -> None:
        self.id = player_id
        self.location: str | None = None
        self._npcs = sorted(npcs)
        self._run = run_id
        self._rate = rate
        self._seed = seed

    def inputs(self, tick: int) -> list[Speech]:
        rng = random.Random(f"{self._seed}:{self.id}:{tick}")
        if not self._npcs or rng.random() >= self._rate:
            return []
        return [
            Speech(
                id=event_id(self._run, self.id, tick, 0),
                tick=tick,
                speaker=self.id,
                to=rng.choice(self._npcs),
                text=rng.choice(BOT_LINES),
                from_player=True,
            )
        ]
