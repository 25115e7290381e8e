"""A finished run's store as a `RunModel` at any tick (read-only, for `npcsim view --db`).

A shard's SQLite file holds the audit records, not the places: NPCs are listed without a
location unless the trace of a live run gave one. Models are rebuilt from the records up
to the chosen tick, and the last one is cached.
"""

from __future__ import annotations

from pathlib import Path

from sim.store import open_reader
from sim.view.model import RunModel
from sim.wire.events import SayMessage
from sim.wire.trace import RosterEntry, TraceMessage, trace_of

__all__ = ["StoredRun"]

_NOT_STORED = "(not stored)"


class StoredRun:
    """The records of one store file, loaded once; `model(tick)` replays them up to `tick`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        traces: list[tuple[TraceMessage, dict[str, str]]] = []
        with open_reader(path) as reader:
            for record in reader.audit_records():
                world = {w.key: w.value for w in record.state.world_state}
                traces.append((trace_of(record, shard="", location=None), world))
        self._traces = traces
        self.run = traces[0][0].run if traces else path.stem
        self.first_tick = traces[0][0].tick if traces else 0
        self.last_tick = traces[-1][0].tick if traces else 0
        self._cached: tuple[int, RunModel] | None = None

    def model(self, tick: int | None = None) -> RunModel:
        """The run as it stood at the end of `tick` (default: the last)."""
        tick = self.last_tick if tick is None else min(max(tick, self.first_tick), self.last_tick)
        if self._cached is not None and self._cached[0] == tick:
            return self._cached[1]
        model = RunModel(self.run)
        agents = sorted({t.agent for t, _ in self._traces})
        model.set_roster(RosterEntry(id=a, name=a, location=_NOT_STORED) for a in agents)
        for trace, world in self._traces:
            if trace.tick > tick:
                break
            say = SayMessage(run=trace.run, agent=trace.agent, tick=trace.tick, to=None, text=trace.line,
                             inference_id=trace.inference_id)
            model.add_trace(trace)
            model.add_line(say)
            model.set_world(world)
        self._cached = (tick, model)
        return model
