"""A finished run's store as a `RunModel` at any tick (read-only, for `npcsim view --db`).

What the live view learns from the run's topics, the stored one reads from the audit
records (the trace of each is rebuilt from its record, explanation included):
- recipients: a reply's input is what it answers, `speaker: text` (the NPC brain's form),
  so the line went to that speaker; an unprompted line's input names the neighbour it is
  for, the first NPC id in it;
- player lines: an input `speaker: text` from someone who is not an NPC of the run is a
  player's line to that NPC, shown just before the answer;
- world state: the entries every NPC of the store holds (the game system's, set for all);
  an entry only some hold is an NPC's own and stays in its prompt, not in the world.

Names and places are not in a store (it does not keep the scenario): with the
`scenario` the run was made from (`npcsim view --db FILE --scenario FILE`) the roster is
the scenario's; without it NPCs are listed by id under a place saying where to get them.
Moves are not read from the store: each NPC stands at its start place, and the page says so.
Models are rebuilt from the records up to the chosen tick, and the last one is cached.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from sim.audit import trace_of
from sim.scenario import Scenario
from sim.store import open_reader
from sim.view.model import RunModel
from sim.wire.events import PlayerInputMessage, SayMessage
from sim.wire.trace import RosterEntry, TraceMessage

__all__ = ["StoredRun"]

_NOT_STORED = "(place not stored: --scenario)"
_START_PLACES = "Where each NPC started: a stored run's view does not follow moves."
_SPEAKER = re.compile(r"^([A-Za-z0-9_.-]{1,128}): (.*)$", re.DOTALL)
_ID = re.compile(r"[A-Za-z0-9_.-]+")


class _Said(msgspec.Struct, frozen=True, kw_only=True):
    """One inference of the store as the model is fed it."""

    trace: TraceMessage
    to: str | None
    heard_from_player: str | None  # the player whose line this answers
    heard: str
    world: dict[str, str]


class StoredRun:
    """The records of one store file, loaded once; `model(tick)` replays them up to `tick`."""

    def __init__(self, path: Path, scenario: Scenario | None = None) -> None:
        self.path = path
        with open_reader(path) as reader:
            records = list(reader.audit_records())
        agents = sorted({r.agent_id for r in records})
        if scenario is not None:
            known = {spec.id: spec for spec in scenario.npcs}
            self._roster = [RosterEntry(id=a, name=known[a].name, location=known[a].location) if a in known
                            else RosterEntry(id=a, name=a, location=_NOT_STORED) for a in agents]
            npc_ids = set(known) | set(agents)
        else:
            self._roster = [RosterEntry(id=a, name=a, location=_NOT_STORED) for a in agents]
            npc_ids = set(agents)
        places = {npc.id: npc.location for npc in self._roster}
        held: dict[str, set[str]] = {}
        for record in records:
            held.setdefault(record.agent_id, set()).update(w.key for w in record.state.world_state)
        shared = set.intersection(*held.values()) if held else set()
        said: list[_Said] = []
        for record in records:
            to, player, heard = _addressee(record.agent_id, record.player_input, npc_ids)
            said.append(_Said(
                trace=trace_of(record, shard="", location=places.get(record.agent_id)),
                to=to, heard_from_player=player, heard=heard,
                world={w.key: w.value for w in record.state.world_state if w.key in shared},
            ))
        self._said = said
        self.run = said[0].trace.run if said else path.stem
        self.first_tick = said[0].trace.tick if said else 0
        self.last_tick = said[-1].trace.tick if said else 0
        self._cached: tuple[int, RunModel] | None = None

    def model(self, tick: int | None = None) -> RunModel:
        """The run as it stood at the end of `tick` (default: the last)."""
        tick = self.last_tick if tick is None else min(max(tick, self.first_tick), self.last_tick)
        if self._cached is not None and self._cached[0] == tick:
            return self._cached[1]
        model = RunModel(self.run)
        model.places_note = _START_PLACES
        model.set_roster(self._roster)
        for one in self._said:
            trace = one.trace
            if trace.tick > tick:
                break
            if one.heard_from_player is not None:
                model.add_player_input(one.heard_from_player, PlayerInputMessage(to=trace.agent, text=one.heard),
                                       tick=trace.tick)
            model.add_trace(trace)
            model.add_line(SayMessage(run=trace.run, agent=trace.agent, tick=trace.tick, to=one.to, text=trace.line,
                                      inference_id=trace.inference_id))
            model.set_world(one.world)
        self._cached = (tick, model)
        return model


def _addressee(agent: str, heard: str, npc_ids: set[str]) -> tuple[str | None, str | None, str]:
    """(to whom the line went, the player it answers or None, what that player said)."""
    match = _SPEAKER.match(heard)
    if match is not None:
        speaker, text = match.groups()
        return speaker, (None if speaker in npc_ids else speaker), text
    named = next((word for word in _ID.findall(heard) if word != agent and word in npc_ids), None)
    return named, None, heard
