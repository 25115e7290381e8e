"""`Recording`: what a re-execution needs of a recorded run, read from all its stores.

Every store of the run is given (`--db` once per shard): they must be stores (schema and
header checked by `open_reader`), belong to one run (run id, seed, scenario, shard count),
hold each shard once, have committed the same last tick, and hold what a re-execution needs
(schema 6: the scenario's bytes, the run's settings, the world-state changes). Whatever
fails is one line naming the file and what is missing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import msgspec

from sim.audit import AuditRecord
from sim.errors import ConfigError, StoreError
from sim.protocol.outside import GameFact, Presence, Taken
from sim.shard import RecordedInputs, parse_shard
from sim.store import RunIdentity, RunSettings, StoreReader, open_reader

__all__ = ["Recording", "load_recording"]


class Recording(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded run: its identity (shard 0's), settings and scenario, every audit record by
    id, its outside inputs and world-state changes by tick, its last committed tick."""

    paths: tuple[Path, ...]
    identity: RunIdentity
    settings: RunSettings
    scenario: bytes
    records: dict[str, AuditRecord]
    inputs: RecordedInputs
    last_tick: int

    @property
    def shards(self) -> int:
        return len(self.paths)


def load_recording(paths: Sequence[str | Path]) -> Recording:
    """Read and check every store of a run; ConfigError or StoreError in one line otherwise."""
    if not paths:
        raise ConfigError("--db: give the store of the run (once per shard for a sharded run)")
    found: dict[int, tuple[Path, RunIdentity]] = {}
    records: dict[str, AuditRecord] = {}
    inputs: dict[int, list[Taken]] = {}
    world: dict[int, dict[str, str]] = {}
    scenario = b""  # the same in every store: the digest their identities share
    last: dict[Path, int | None] = {}
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise ConfigError(f"--db {path}: no such file")
        with open_reader(path) as reader:
            identity, scenario, changes = _replayable(path, reader)
            index = parse_shard(identity.shard)[0]
            first = next(iter(found.values()), None)
            if first is not None and not _same_run(first[1], identity):
                raise ConfigError(f"--db {path}: belongs to {identity.describe(scenario=True)}, "
                                  f"not to {first[1].describe(scenario=True)} of {first[0]}")
            if index in found:
                raise ConfigError(f"--db {path}: shard {index} was given already ({found[index][0]})")
            found[index] = (path, identity)
            last[path] = reader.last_tick()
            if index == 0:
                world = changes
            for tick, taken in reader.all_inputs():
                if index == 0 or not _every_shards(taken):
                    inputs.setdefault(tick, []).append(taken)
            records.update((r.id, r) for r in reader.audit_records())
    _, count = parse_shard(next(iter(found.values()))[1].shard)
    missing = [str(i) for i in range(count) if i not in found]
    if missing:
        raise ConfigError(f"--db: the run has {count} shards; the stores of shard {', '.join(missing)} are missing")
    empty = [str(p) for p, t in last.items() if t is None]
    if empty:
        raise StoreError(f"--db {empty[0]}: holds no committed tick, nothing to re-execute")
    if len(set(last.values())) != 1:
        ticks = ", ".join(f"{p} at tick {t}" for p, t in last.items())
        raise StoreError(f"--db: the stores did not commit the same last tick ({ticks}); resume the run first")
    identity0 = found[0][1]
    assert identity0.settings is not None  # checked by _replayable
    for tick in inputs:
        inputs[tick].sort(key=lambda taken: taken.seq)
    return Recording(
        paths=tuple(found[i][0] for i in range(count)), identity=identity0, settings=identity0.settings,
        scenario=scenario, records=records, inputs=RecordedInputs(inputs=inputs, world=world),
        last_tick=int(next(iter(last.values())) or 0),
    )


def _replayable(path: Path, reader: StoreReader) -> tuple[RunIdentity, bytes, dict[int, dict[str, str]]]:
    """The store's identity, scenario bytes and world-state changes, when it holds all a
    re-execution needs; else a StoreError saying what it lacks."""
    identity = reader.run_identity()
    scenario = reader.scenario_data()
    world = reader.world_changes()
    missing = []
    if identity is None:
        missing.append("a run identity")
    elif identity.settings is None:
        missing.append("the run's settings")
    if scenario is None:
        missing.append("the scenario's text")
    if missing or identity is None or scenario is None:
        said = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
        raise StoreError(f"{path}: cannot be re-executed: it lacks {said} (its run was first started by an npcsim "
                         "before schema 6)")
    if hashlib.sha256(scenario).hexdigest() != identity.scenario_sha256:
        raise StoreError(f"{path}: the scenario's text it holds is not the one its run read (SHA-256 differs)")
    return identity, scenario, world


def _every_shards(taken: Taken) -> bool:
    """Whether every shard took `taken` (a player's presence, a fact for every NPC): the
    re-execution, one shard, takes shard 0's."""
    return isinstance(taken, Presence) or (isinstance(taken, GameFact) and taken.npc is None)


def _same_run(a: RunIdentity, b: RunIdentity) -> bool:
    """The same run id, seed, scenario and shard count (each shard has its own index, and
    without a run key its own nonce)."""
    return (a.run_id, a.seed, a.scenario_sha256, parse_shard(a.shard)[1]) == (
        b.run_id, b.seed, b.scenario_sha256, parse_shard(b.shard)[1])
