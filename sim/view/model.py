"""What the page shows, as a plain object fed with messages (no I/O, injectable clock).

The live view feeds it MQTT payloads (`feed`), the stored view feeds it the audit
records of a finished run (`set_roster`, `add_trace`, `add_line`, `add_player_input`,
`set_world`); the server only reads it. Where an NPC stands is the roster's start place until
a (retained) `location` message moves it, whichever of the two arrives first. Memory is
bounded whatever the run's length: the newest `max_lines` dialogue lines, the last
`history` traces per NPC with the prompt kept for the newest only, and per NPC the newest
`KEPT_PROPOSALS` of each of: beliefs learned, memories kept and intents emitted (what the
gates accepted of the reply it said, with the inference that proposed it), and proposals
refused (with their verdict codes; docs/npc-output.md).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import msgspec

from sim.output import ProposalVerdict, said_proposals
from sim.wire import topics
from sim.wire.events import (
    LocationMessage,
    PlayerInputMessage,
    SayMessage,
    decode_error,
    decode_location,
    decode_player_input,
    decode_say,
    decode_status,
    decode_world_state,
)
from sim.wire.trace import RosterEntry, TraceMessage, decode_roster, decode_traces

__all__ = ["KEPT_PROPOSALS", "DialogueLine", "RunModel"]

_RATE_WINDOW_S = 10.0
_NO_LOCATION = "(unknown)"
KEPT_PROPOSALS = 20
"""Per NPC and kind (beliefs, memories, intents, refused), the newest proposals the view keeps."""
_OUTCOMES = ("beliefs", "memories", "intents", "refused")
_ACCEPTED_AS = {"belief": "beliefs", "memory": "memories", "intent": "intents"}


class DialogueLine(msgspec.Struct, kw_only=True):
    """One line of the dialogue; `kind` is "npc", "player" (a player's input) or "fallback"."""

    seq: int
    tick: int
    speaker: str
    to: str | None
    text: str
    location: str
    kind: str
    inference_id: str = ""


class _Health(msgspec.Struct, kw_only=True):
    tick: int = -1
    inferences: int = 0
    fallbacks: int = 0
    malformed: int = 0  # messages the view could not read (dropped)
    refused: int = 0  # inputs the run refused (its errors on player/+/error)
    lines: int = 0


class RunModel:
    """The state of one run as a viewer knows it."""

    def __init__(self, run: str, *, max_lines: int = 5000, history: int = 5) -> None:
        self.run = run
        self.npcs: dict[str, RosterEntry] = {}
        self.moves: dict[str, LocationMessage] = {}  # each NPC's newest location message
        self.world: dict[str, str] = {}
        self.shards: dict[str, dict[str, Any]] = {}
        self.health = _Health()
        self.malformed_kinds: collections.Counter[str] = collections.Counter()
        self.refused_codes: collections.Counter[str] = collections.Counter()
        self.version = 0  # bumped on any change; the event stream compares it
        self.world_version = 0  # bumped when the NPC list, the places or the world state change
        self._lines: collections.deque[DialogueLine] = collections.deque(maxlen=max_lines)
        self._by_inference: dict[str, DialogueLine] = {}
        self._fallback_ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._traces: dict[str, collections.deque[TraceMessage]] = {}
        self._outcomes: dict[str, dict[str, collections.deque[dict[str, Any]]]] = {}
        self._history = history
        self._seq = 0
        self._samples: collections.deque[tuple[float, int, int]] = collections.deque()
        self.npc_versions: dict[str, int] = {}

    # --- feeding -------------------------------------------------------------------------

    def feed(self, topic: str, payload: bytes, now: float) -> None:
        """Apply one MQTT message of this run; a malformed one is counted by kind and dropped
        (`malformed`); an error the run sent a player is counted by code (`refused`). A topic of
        this run that names nothing (`player//input` matches the view's `player/+/input`) is
        malformed too, of kind "topic"; another run's or root's is none of the view's business."""
        parsed = topics.parse(topic)
        if parsed is None:
            if topic.startswith(f"{topics.ROOT}/{self.run}/"):
                self.malformed_kinds["topic"] += 1
                self.health.malformed += 1
                self.version += 1
            return
        kind, name = parsed.kind, parsed.name
        try:
            if kind == "agent_say":
                self.add_line(decode_say(payload))
            elif kind == "agent_location":
                self.set_location(decode_location(payload))
            elif kind == "player_input":
                self.add_player_input(name, decode_player_input(payload))
            elif kind == "world_state":
                self.set_world(decode_world_state(payload).state)
            elif kind == "status":
                status = decode_status(payload)
                self.shards[name] = {"state": status.state, "tick": status.tick}
                if status.tick is not None:
                    self._see_tick(status.tick)
            elif kind == "trace":
                for trace in decode_traces(payload):
                    self.add_trace(trace)
            elif kind == "roster":
                self.set_roster(decode_roster(payload).npcs)
            elif kind == "player_error":
                self.refused_codes[decode_error(payload).code] += 1
                self.health.refused += 1
            else:
                return
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.malformed_kinds[kind] += 1
            self.health.malformed += 1
        self._sample(now)
        self.version += 1

    def set_roster(self, npcs: Iterable[RosterEntry]) -> None:
        """The NPCs and their start places; one that moved already stays where it went."""
        for npc in npcs:
            moved = self.moves.get(npc.id)
            self.npcs[npc.id] = npc if moved is None else msgspec.structs.replace(npc, location=moved.location)
        self.world_version += 1

    def set_location(self, moved: LocationMessage) -> None:
        """An NPC stands at `moved.location` from its tick on; a message older than the one
        known (a retained one arriving late) changes nothing."""
        known = self.moves.get(moved.agent)
        if known is not None and known.tick > moved.tick:
            return
        self.moves[moved.agent] = moved
        npc = self.npcs.get(moved.agent)
        self.npcs[moved.agent] = RosterEntry(id=moved.agent, name=npc.name if npc else moved.agent,
                                             location=moved.location)
        self._see_tick(moved.tick)
        self.world_version += 1

    def set_world(self, state: dict[str, str]) -> None:
        self.world.update(state)
        self.world_version += 1

    def add_line(self, say: SayMessage) -> None:
        npc = self.npcs.get(say.agent)
        kind = "fallback" if say.inference_id in self._fallback_ids else "npc"
        line = self._append(say.tick, say.agent, say.to, say.text, npc.location if npc else _NO_LOCATION, kind)
        line.inference_id = say.inference_id
        self._by_inference[say.inference_id] = line
        while len(self._by_inference) > (self._lines.maxlen or 0):
            self._by_inference.pop(next(iter(self._by_inference)))
        self._see_tick(say.tick)

    def add_player_input(self, player: str, message: PlayerInputMessage, tick: int | None = None) -> None:
        """A player's line to an NPC, at `tick` (default: the newest tick seen, as it arrives live)."""
        npc = self.npcs.get(message.to)
        self._append(max(self.health.tick, 0) if tick is None else tick, player, message.to, message.text,
                     npc.location if npc else _NO_LOCATION, "player")

    def add_trace(self, trace: TraceMessage) -> None:
        history = self._traces.get(trace.agent)
        if history is None:
            history = self._traces[trace.agent] = collections.deque(maxlen=self._history)
        if history and history[-1].prompt is not None:
            history[-1] = msgspec.structs.replace(history[-1], prompt=None)  # only the newest prompt is kept
        history.append(trace)
        self._add_outcomes(trace)
        self.npc_versions[trace.agent] = self.version + 1
        if trace.agent not in self.npcs and trace.location is not None:
            self.set_roster([RosterEntry(id=trace.agent, name=trace.agent, location=trace.location)])
        self.health.inferences += 1
        if trace.fallback:
            self.health.fallbacks += 1
            line = self._by_inference.get(trace.inference_id)
            if line is not None:
                line.kind = "fallback"
            else:  # the trace came before its `say`: remember it for a while
                self._fallback_ids[trace.inference_id] = None
                if len(self._fallback_ids) > 1000:
                    self._fallback_ids.popitem(last=False)
        self._see_tick(trace.tick)

    def _add_outcomes(self, trace: TraceMessage) -> None:
        """What the gates made of the trace's proposals: applied (the reply said) or refused (any attempt)."""
        applied = said_proposals(trace.attempts, fallback=trace.fallback)
        refused = [p for a in trace.attempts for p in a.proposals if p.kind != "line" and p.verdict == "rejected"]
        if not applied and not refused:
            return
        kept = self._outcomes.get(trace.agent)
        if kept is None:
            kept = self._outcomes[trace.agent] = {k: collections.deque(maxlen=KEPT_PROPOSALS) for k in _OUTCOMES}

        def entry(p: ProposalVerdict) -> dict[str, Any]:
            return {**msgspec.to_builtins(p), "tick": trace.tick, "inference_id": trace.inference_id}

        for p in applied:
            kept[_ACCEPTED_AS[p.kind]].append(entry(p))
        for p in refused:
            kept["refused"].append(entry(p))

    def _append(self, tick: int, speaker: str, to: str | None, text: str, location: str, kind: str) -> DialogueLine:
        self._seq += 1
        line = DialogueLine(seq=self._seq, tick=tick, speaker=speaker, to=to, text=text, location=location, kind=kind)
        self._lines.append(line)
        self.health.lines += 1
        return line

    def _see_tick(self, tick: int) -> None:
        self.health.tick = max(self.health.tick, tick)

    def _sample(self, now: float) -> None:
        self._samples.append((now, self.health.tick, self.health.inferences))
        while len(self._samples) > 2 and now - self._samples[1][0] > _RATE_WINDOW_S:
            self._samples.popleft()

    # --- reading -------------------------------------------------------------------------

    def rates(self, now: float) -> tuple[float, float]:
        """(ticks/s, inferences/s) over the last ten seconds or so."""
        if len(self._samples) < 2:
            return 0.0, 0.0
        t0, tick0, inf0 = self._samples[0]
        span = max(now - t0, 1e-9)
        return max(self.health.tick - tick0, 0) / span, (self.health.inferences - inf0) / span

    def health_view(self, now: float) -> dict[str, Any]:
        ticks_per_s, inferences_per_s = self.rates(now)
        return {
            **msgspec.structs.asdict(self.health),
            "ticks_per_s": round(ticks_per_s, 2),
            "inferences_per_s": round(inferences_per_s, 2),
            "malformed_kinds": dict(self.malformed_kinds),
            "refused_codes": dict(self.refused_codes),
            "shards": {k: self.shards[k] for k in sorted(self.shards)},
        }

    def world_view(self) -> dict[str, Any]:
        places: dict[str, list[str]] = {}
        for npc in sorted(self.npcs.values(), key=lambda n: n.id):
            places.setdefault(npc.location, []).append(npc.id)
        return {
            "locations": [{"id": loc, "npcs": ids} for loc, ids in sorted(places.items())],
            "names": {npc.id: npc.name for npc in self.npcs.values()},
            "activities": {agent: m.activity for agent, m in sorted(self.moves.items()) if m.activity},
            "state": dict(sorted(self.world.items())),
        }

    def lines(
        self, *, after: int = 0, before: int | None = None, limit: int = 200, npc: str = "", location: str = ""
    ) -> list[DialogueLine]:
        """The newest `limit` lines with after < seq < before, matching the filters, oldest first."""
        found: list[DialogueLine] = []
        for line in reversed(self._lines):
            if line.seq <= after or len(found) >= limit:
                break
            if before is not None and line.seq >= before:
                continue
            if npc and npc not in (line.speaker, line.to):
                continue
            if location and line.location != location:
                continue
            found.append(line)
        found.reverse()
        return found

    @property
    def last_seq(self) -> int:
        return self._seq

    def npc_view(self, agent: str) -> dict[str, Any] | None:
        """The NPC's newest traces (newest first) with the newest prompt, and what it learned,
        emitted and was refused (`proposals`, each list newest first); None if unknown."""
        npc = self.npcs.get(agent)
        history = self._traces.get(agent, ())
        if npc is None and not history:
            return None
        mine = self._outcomes.get(agent, {})
        return {
            "id": agent,
            "name": npc.name if npc else agent,
            "location": npc.location if npc else _NO_LOCATION,
            "traces": [msgspec.to_builtins(t) for t in reversed(history)],
            "proposals": {k: list(reversed(mine.get(k, ()))) for k in _OUTCOMES},
        }
