"""A store belongs to one run: `RunIdentity`, written at the run's first start, kept in the `run` table.

A store resumed by another run (another run id, seed, scenario or shard layout) mixed two
runs' histories and then hung. So the store keeps who it belongs to, and a start that is
not that run is refused (sim.shard checks it, naming both sides). The identity also holds
the run's nonce (sim.protocol.seal): chosen at the first start, kept across every resume,
different for another run of the same id and key.

One row, the identity as JSON (`run.identity`); `sqlite3 tw.db "SELECT identity FROM run"`
reads it. A store no run has started yet has no row until a start writes one.

The identity also holds `settings`: what a re-execution (`npcsim replay`, sim.replay)
needs besides the scenario's text (its own table, `scenario`), the outside inputs and the
world-state changes (tables `inputs` and `world_changes`) and the replies (the audit): the
effective working-memory config, the seed and tick settings, the players, the bounds on
outside input, the backend, its options and the output check's fact guard, as the first
start ran them. An identity without them (`settings` is None) cannot be executed again.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sim.memory import WorkingMemoryConfig

__all__ = ["RunIdentity", "RunSettings", "decode_identity", "encode_identity"]


class RunSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The configuration of a run as its first start ran it: what decides what its NPCs say.

    `memory` is the effective working-memory config (the scenario's with the run's
    `--set memory.*` changes); `end_tick` the tick the run was to end before; `bots` and
    `bot_rate` its bot players; `backend`, `backend_options` and `model` (the option of
    that name, "" when none; each audit record names the model that answered) the backend,
    `remote_workers` whether it was served by `npcsim worker`s; `retain_memories` the
    retention; `fact_guard` the output check's guard ("": the built-in one).
    """

    memory: WorkingMemoryConfig
    end_tick: int
    tick_ms: int = 0
    bots: int = 0
    bot_rate: float = 0.1
    inference_timeout: float = 30.0
    backend: str = "scripted"
    backend_options: dict[str, Any] = {}
    model: str = ""
    remote_workers: bool = False
    retain_memories: int | None = None
    fact_guard: str = ""

    @staticmethod
    def model_named(options: dict[str, Any]) -> str:
        """The model a backend's options name (`model`, or llamacpp's `model_path`), "" when none."""
        return str(options.get("model", options.get("model_path", "")) or "")


class RunIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """Which run a store belongs to.

    `scenario_sha256` is the SHA-256 of the scenario file's bytes as the run read them;
    `shard` the layout "i/n"; `nonce` the run instance's (hex, sim.protocol.seal).
    """

    run_id: str
    seed: int
    scenario: str  # the scenario's name ([scenario] name)
    scenario_sha256: str
    shard: str
    nonce: str
    settings: RunSettings | None = None

    def describe(self, *, scenario: bool = False) -> str:
        """"run village-7 seed 7 (shard 0/1)", with the scenario when asked."""
        text = f"run {self.run_id} seed {self.seed} (shard {self.shard})"
        if scenario:
            text += f" of scenario {self.scenario} (sha256 {self.scenario_sha256[:12]})"
        return text

    def same_run(self, other: RunIdentity) -> bool:
        """The same run id, seed, scenario text and shard layout (the nonce is not compared)."""
        return (self.run_id, self.seed, self.scenario_sha256, self.shard) == (
            other.run_id, other.seed, other.scenario_sha256, other.shard,
        )


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RunIdentity)


def encode_identity(identity: RunIdentity) -> str:
    return _encoder.encode(identity).decode()


def decode_identity(text: str | bytes) -> RunIdentity:
    """Raises msgspec.DecodeError (or ValidationError) when the row is not an identity."""
    return _decoder.decode(text)
