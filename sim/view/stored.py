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
the scenario's, and each NPC stands where the engine had it at the chosen tick: its moves
are made again as the run made them (sim.shard's `Whereabouts`: the routines, the `go_to`
its records accepted, the game's moves the store's inputs hold). Without it NPCs are listed
by id under a place saying where to get them.
Models are rebuilt from the records up to the chosen tick, and the last one is cached.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from sim.audit import AuditRecord, trace_of
from sim.output import said_proposals, walked_to
from sim.scenario import Scenario
from sim.shard import Moved, Whereabouts
from sim.store import open_reader
from sim.view.model import RunModel
from sim.wire.events import LocationMessage, PlayerInputMessage, SayMessage
from sim.wire.inputs import Move
from sim.wire.trace import RosterEntry, TraceMessage

__all__ = ["StoredRun"]

_NOT_STORED = "(place not stored: --scenario)"
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
            moved = [(tick, (taken.npc, taken.location)) for tick, taken in reader.all_inputs()
                     if isinstance(taken, Move)]
        agents = sorted({r.agent_id for r in records})
        if scenario is not None:
            known = {spec.id: spec for spec in scenario.npcs}
            self._roster = [RosterEntry(id=a, name=known[a].name, location=known[a].location) if a in known
                            else RosterEntry(id=a, name=a, location=_NOT_STORED) for a in agents]
            npc_ids = set(known) | set(agents)
        else:
            self._roster = [RosterEntry(id=a, name=a, location=_NOT_STORED) for a in agents]
            npc_ids = set(agents)
        self._walks = None if scenario is None else _Walks(scenario, records, moved)
        places = {npc.id: npc.location for npc in self._roster}
        held: dict[str, set[str]] = {}
        for record in records:
            held.setdefault(record.agent_id, set()).update(w.key for w in record.state.world_state)
        shared = set.intersection(*held.values()) if held else set()
        said: list[_Said] = []
        for record in records:
            to, player, heard = _addressee(record.agent_id, record.player_input, npc_ids)
            place = places.get(record.agent_id) if self._walks is None else self._walks.place(record)
            said.append(_Said(
                trace=trace_of(record, shard="", location=place),
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
        model.set_roster(self._roster)
        if self._walks is not None:
            for move in self._walks.moved_by(tick):
                model.set_location(move)
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


class _Walks:
    """The run's moves made again from its scenario and store, tick by tick (`Whereabouts`)."""

    def __init__(self, scenario: Scenario, records: list[AuditRecord], game: list[tuple[int, tuple[str, str]]]) -> None:
        self._run = records[0].run_id if records else ""
        chosen: dict[int, list[tuple[str, str]]] = {}
        for record in records:  # an applied go_to of tick t: the NPC stands there from t + 1
            for proposal in said_proposals(record.attempts, fallback=record.fallback):
                place = walked_to(proposal)
                if place is not None:
                    chosen.setdefault(record.tick + 1, []).append((record.agent_id, place))
        for tick, move in game:
            chosen.setdefault(tick, []).append(move)
        self._where = Whereabouts(scenario, {loc.id: 0 for loc in scenario.locations})
        self._chosen, self._tick = chosen, 0
        self._history: list[LocationMessage] = []  # every move made again so far, in tick order
        self._made(0, self._where.begin(0, {}, resumed=False))

    def _to(self, tick: int) -> None:
        while self._tick < tick:
            self._tick += 1
            self._made(self._tick, self._where.advance(self._tick, self._chosen.get(self._tick, ())))

    def _made(self, tick: int, moved: list[Moved]) -> None:
        self._history += [LocationMessage(run=self._run, agent=move.npc, tick=tick, location=move.location,
                                          activity=move.activity) for move in moved]

    def place(self, record: AuditRecord) -> str:
        """Where the record's NPC stood when it spoke (records come in tick order)."""
        self._to(record.tick)
        return self._where.where[record.agent_id]

    def moved_by(self, tick: int) -> list[LocationMessage]:
        """Each NPC's newest move up to `tick` (a move of its activity alone included)."""
        self._to(tick)
        newest = {m.agent: m for m in self._history if m.tick <= tick}
        return [newest[agent] for agent in sorted(newest)]


def _addressee(agent: str, heard: str, npc_ids: set[str]) -> tuple[str | None, str | None, str]:
    """(to whom the line went, the player it answers or None, what that player said)."""
    match = _SPEAKER.match(heard)
    if match is not None:
        speaker, text = match.groups()
        return speaker, (None if speaker in npc_ids else speaker), text
    named = next((word for word in _ID.findall(heard) if word != agent and word in npc_ids), None)
    return named, None, heard
