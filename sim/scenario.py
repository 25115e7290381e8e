"""Scenario files: a world as TOML, validated with msgspec.

Every error names the file, the NPC (or player) and the field at fault; a schema error
also gives the line (`village.toml:90: ...`) and, for a mistyped field name, the field
meant ("did you mean `ambient_chance`?"). What is read is bounded: a path that is not a
regular file (`/dev/zero`, a FIFO) or a file over `MAX_SCENARIO_BYTES` is refused before a
byte is read, and every check over a list runs in one pass (a 200,000-memory NPC loads in
linear time).

The shared `[[world]]` is published on the world-state topic when a run starts, so it must
be what that topic accepts from the game system (key names, `InputBounds`' defaults): the
loader refuses the rest, naming the key, instead of the run dropping its own world state.
"""

from __future__ import annotations

import functools
import hashlib
import stat
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import msgspec
import rtoml

from sim.day import GO_TO, GOAL_FACT, PLACES_KEY, PlaceMap, ScheduleEntry, goal_text
from sim.errors import ScenarioError
from sim.memory import Belief, Episode, Fact, Line, NpcState, WorkingMemoryConfig, WorldFact
from sim.output import ArgSpec, OutputPolicy, WorldValues, allow_list_problem
from sim.resources import bundled_scenario, scenario_names
from sim.scenario_checks import check_day, check_world, npc_at
from sim.scenario_errors import schema_error
from sim.scenario_text import cut
from sim.wire.events import Name

__all__ = [
    "MAX_SCENARIO_BYTES",
    "InferenceSpec",
    "LocationSpec",
    "NpcSpec",
    "PlayerInput",
    "PlayerSpec",
    "Scenario",
    "ScenarioMeta",
    "ScenarioText",
    "load_scenario",
    "parse_scenario",
    "read_scenario",
]

MAX_SCENARIO_BYTES = 1_000_000_000
"""A scenario file's size at most (1 GB: a 100,000-NPC world is a few tens of MB)."""

Tick = Annotated[int, msgspec.Meta(ge=0)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Phrase = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ScenarioMeta(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Name
    description: str = ""
    seed: int = 0
    ticks: Annotated[int, msgspec.Meta(ge=1)] = 30
    ticks_per_day: Annotated[int, msgspec.Meta(ge=1)] | None = None


class LocationSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: Name
    name: str = ""
    exits: list[Name] = []


class NpcSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One NPC: where it stands, who it is, and the state it starts with.

    `output`, `forbidden` and `intents` are its output policy (docs/npc-output.md): a line or
    a structured reply, the phrases it must never reveal, the intents it may propose with
    their arguments' types, or the values an argument may be.
    """

    id: Name
    name: str
    location: Name
    system_prompt: str
    kind: str = "npc"
    ambient_chance: Probability = 0.05
    fallback_lines: list[str] = []
    facts: list[Fact] = []
    world: list[WorldFact] = []
    episodic: list[Episode] = []
    beliefs: list[Belief] = []
    dialogue: list[Line] = []
    output: Literal["line", "structured"] = "line"
    forbidden: list[Phrase] = []
    intents: dict[Name, dict[Name, ArgSpec]] = {}
    schedule: list[ScheduleEntry] = []
    goal: Annotated[str, msgspec.Meta(max_length=500)] = ""

    def policy(self) -> OutputPolicy | None:
        """What its replies are held to; None for a line with nothing forbidden (as every NPC before)."""
        if self.output == "line" and not self.forbidden:
            return None
        intents = self.intents
        if GO_TO in intents:  # the engine applies it: the place must be one it can walk to now
            intents = {**intents, GO_TO: {"location": WorldValues(world=PLACES_KEY)}}
        return OutputPolicy(structured=self.output == "structured", forbidden=tuple(self.forbidden), intents=intents)


class PlayerInput(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tick: Tick
    to: Name
    text: Annotated[str, msgspec.Meta(min_length=1)]


class PlayerSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: Name
    name: str = ""
    location: Name | None = None
    script: list[PlayerInput] = []


ServerUrl = Annotated[str, msgspec.Meta(pattern=r"^https?://\S+$", max_length=2048)]


class InferenceSpec(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `openai` backend's servers (base URLs), for a run that names none (`--base-url`)."""

    servers: Annotated[list[ServerUrl], msgspec.Meta(max_length=256)] = []


class Scenario(_Spec, frozen=True, kw_only=True, forbid_unknown_fields=True, dict=True):
    scenario: ScenarioMeta
    locations: list[LocationSpec]
    npcs: list[NpcSpec]
    world: list[WorldFact] = []
    players: list[PlayerSpec] = []
    memory: WorkingMemoryConfig = WorkingMemoryConfig()
    inference: InferenceSpec = InferenceSpec()

    @functools.cached_property
    def _npcs_by_id(self) -> dict[str, NpcSpec]:
        """Built once, on first use: lookups stay O(1) with 100,000 NPCs."""
        return {spec.id: spec for spec in self.npcs}

    @functools.cached_property
    def _world_by_key(self) -> dict[str, WorldFact]:
        return {w.key: w for w in self.world}

    @functools.cached_property
    def place_map(self) -> PlaceMap:
        return PlaceMap({loc.id: loc.exits for loc in self.locations})

    def npc(self, npc_id: str) -> NpcSpec:
        return self._npcs_by_id[npc_id]

    def initial_state(self, npc: str | NpcSpec) -> NpcState:
        """The state an NPC starts with: the world's state overlaid by its own."""
        spec = self.npc(npc) if isinstance(npc, str) else npc
        world = dict(self._world_by_key)
        world.update({w.key: w for w in spec.world})
        return NpcState(
            agent_id=spec.id,
            system_prompt=spec.system_prompt,
            canonical_facts=(*spec.facts, *((Fact(id=GOAL_FACT, text=goal_text(spec.goal)),) if spec.goal else ())),
            world_state=tuple(world.values()),
            episodic=tuple(spec.episodic),
            beliefs=tuple(spec.beliefs),
            dialogue=tuple(spec.dialogue),
        )


class ScenarioText(NamedTuple):
    """A scenario's bytes as read, and where they came from (for errors)."""

    data: bytes
    source: str

    @property
    def sha256(self) -> str:
        """The digest of the bytes: what a store records of the scenario its run ran."""
        return hashlib.sha256(self.data).hexdigest()


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file, or the bundled scenario of that name (`village`).

    A file wins: `village` means the bundled village only when no file `village` exists.
    """
    text = read_scenario(path)
    return parse_scenario(text.data, source=text.source)


def read_scenario(path: str | Path) -> ScenarioText:
    """The bytes of a scenario file (a regular file of at most MAX_SCENARIO_BYTES), or of the bundled one."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as exc:
        if str(path) in scenario_names():
            return _bundled(str(path))
        raise ScenarioError(
            f"{path}: cannot read the scenario file: {exc.strerror or exc} "
            f"(bundled scenarios, by name: {', '.join(scenario_names())})"
        ) from exc
    if not stat.S_ISREG(info.st_mode):
        if str(path) in scenario_names():
            return _bundled(str(path))
        raise ScenarioError(f"{path}: not a regular file; a scenario is a TOML file")
    if info.st_size > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{path}: {info.st_size:,} bytes; a scenario file is at most {MAX_SCENARIO_BYTES:,} bytes")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file: {exc.strerror or exc}") from exc
    if len(data) > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{path}: grew past {MAX_SCENARIO_BYTES:,} bytes while it was read")
    return ScenarioText(data, str(path))


def parse_scenario(data: bytes | str, *, source: str = "<scenario>") -> Scenario:
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{source}: not UTF-8 text: {exc}") from exc
    scenario = _in_parts(text) if len(text) > PARTS_FROM else None
    if scenario is None:
        scenario = _whole(text, source)
    _check_references(scenario, source)
    check_world(scenario.world, source)
    check_day(source, scenario.scenario.ticks_per_day, {loc.id: loc.exits for loc in scenario.locations},
              ((npc.id, npc.schedule) for npc in scenario.npcs))
    return scenario


PARTS_FROM = 8 << 20
"""Scenario texts longer than this are parsed a part at a time (sim.scenario_text) when they can be."""


def _whole(text: str, source: str) -> Scenario:
    """The scenario of the whole text, parsed at once; a ScenarioError says what is wrong and where."""
    try:
        # rtoml (Rust) rather than tomllib: a large world parses several times faster.
        raw = rtoml.loads(text)
    except rtoml.TomlParsingError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from exc
    npcs = raw.get("npcs")
    for i, npc in enumerate(npcs if isinstance(npcs, list) else ()):  # before the types: they name no table key
        if isinstance(npc, dict) and (problem := allow_list_problem(npc.get("intents"))) is not None:
            raise ScenarioError(f"{npc_at(source, npc.get('id'), i)}, field {problem}")
    try:
        return msgspec.convert(raw, Scenario)
    except msgspec.ValidationError as exc:
        raise ScenarioError(schema_error(source, text, raw, str(exc), Scenario)) from exc


def _in_parts(text: str) -> Scenario | None:
    """The scenario of a large text parsed a part of its NPCs at a time; None when the text
    cannot be cut, or a part has anything wrong (then the whole text is parsed, and says what)."""
    parts = cut(text)
    if parts is None:
        return None
    try:
        head = rtoml.loads(parts.rest)
        if "npcs" in head:
            return None
        head["npcs"] = []
        scenario = msgspec.convert(head, Scenario)
        npcs: list[NpcSpec] = []
        for part in parts.npc_parts():
            raw = rtoml.loads(part).get("npcs", [])
            if any(isinstance(npc, dict) and allow_list_problem(npc.get("intents")) is not None for npc in raw):
                return None
            npcs += msgspec.convert(raw, list[NpcSpec])
            del raw
    except (rtoml.TomlParsingError, msgspec.ValidationError):
        return None
    return msgspec.structs.replace(scenario, npcs=npcs)


def _check_references(scenario: Scenario, source: str) -> None:
    """Ids unique, and every place, NPC and intent an entry names is the scenario's."""
    locations = {loc.id for loc in scenario.locations}
    if len(locations) != len(scenario.locations):
        raise ScenarioError(f"{source}: locations: duplicate location id")
    npc_ids: set[str] = set()
    for i, npc in enumerate(scenario.npcs):
        if npc.id in npc_ids:
            raise ScenarioError(f"{npc_at(source, npc.id, i)}, field id: duplicate NPC id {npc.id!r}")
        npc_ids.add(npc.id)
        if npc.location not in locations:
            raise ScenarioError(f"{npc_at(source, npc.id, i)}, field location: unknown location {npc.location!r}")
        if npc.intents and npc.output != "structured":
            raise ScenarioError(f"{npc_at(source, npc.id, i)}, field intents: intents need output = \"structured\"")
        for field, ids in (
            ("facts", [f.id for f in npc.facts]),
            ("episodic", [e.id for e in npc.episodic]),
            ("beliefs", [b.id for b in npc.beliefs]),
            ("world", [w.key for w in npc.world]),
        ):
            if len(ids) > 1 and len(set(ids)) != len(ids):  # a million NPCs: no Counter for each list
                raise ScenarioError(f"{npc_at(source, npc.id, i)}, field {field}: duplicate ids {_duplicates(ids)}")
    player_ids: set[str] = set()
    for i, player in enumerate(scenario.players):
        where = f"{source}: player {player.id!r} (players[{i}])"
        if player.id in npc_ids or player.id in player_ids:
            raise ScenarioError(f"{where}, field id: id {player.id!r} is already taken")
        player_ids.add(player.id)
        if player.location is not None and player.location not in locations:
            raise ScenarioError(f"{where}, field location: unknown location {player.location!r}")
        for j, line in enumerate(player.script):
            if line.to not in npc_ids:
                raise ScenarioError(f"{where}, field script[{j}].to: unknown NPC {line.to!r}")


def _bundled(name: str) -> ScenarioText:
    return ScenarioText(bundled_scenario(name).encode(), f"{name} (bundled scenario)")


def _duplicates(ids: Iterable[str]) -> list[str]:
    """The ids that occur more than once, sorted: one pass over the list."""
    return sorted(x for x, n in Counter(ids).items() if n > 1)
