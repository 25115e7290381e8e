"""The fault schedule, a pure function of a seed (sans-I/O: no clock, no processes).

`draw(seed)` picks the world, the number of shards, the horizon and a list of faults, each
at a tick with a duration, plus the outside inputs and world-state changes published over
the run. The runner (tests/faults/runner.py) executes a Schedule; this module only says
what happens when, so a failure is reproduced from its seed alone.

Faults never overlap: each starts at least `GAP` ticks after the previous one began, and
the runner ends one (restarts what it stopped) before it starts the next, so no schedule
asks for something the runner cannot do (a partitioned shard killed, a broker killed twice).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "BROKER_KILL",
    "INFRA",
    "KINDS",
    "MAX_DURATION_S",
    "MODEL",
    "MODEL_HANG",
    "MODEL_500",
    "MODEL_SLOW",
    "PARTITION",
    "PROXY_RESET",
    "PROXY_STALL",
    "SHARD_KILL",
    "WORKER_KILL",
    "Fault",
    "Input",
    "Schedule",
    "WorldChange",
    "draw",
]

BROKER_KILL = "broker-kill"  # kill -9 the broker, start it again on the same port after `duration_s`
SHARD_KILL = "shard-kill"  # kill -9 shard `target`, start it with --resume after `duration_s`
WORKER_KILL = "worker-kill"  # kill -9 a remote worker mid-inference, start another after `duration_s`
PARTITION = "partition"  # shard `target`'s veth link down for `duration_s`
PROXY_RESET = "proxy-reset"  # the fault proxy resets shard `target`'s broker connection
PROXY_STALL = "proxy-stall"  # the fault proxy holds shard `target`'s bytes for `duration_s`
MODEL_500 = "model-500"  # the model server answers 500 for `duration_s`
MODEL_HANG = "model-hang"  # the model server never answers for `duration_s`
MODEL_SLOW = "model-slow"  # the model server answers late (below the timeout) for `duration_s`

INFRA = (BROKER_KILL, SHARD_KILL, WORKER_KILL, PARTITION, PROXY_RESET, PROXY_STALL)
MODEL = (MODEL_500, MODEL_HANG, MODEL_SLOW)
KINDS = INFRA + MODEL

MAX_DURATION_S = 10.0
UNHELD_S = 3.0  # the longest fault that does not hold the run (it goes on meanwhile, ~10 ticks)
GAP = 4  # ticks between the starts of two faults
FIRST = 2  # the first tick a fault may start at (the run is going)
TAIL = 4  # ticks at the end with no fault, input or world change begun (each is answered before the end)


@dataclass(frozen=True)
class Fault:
    kind: str
    tick: int  # injected once every shard has begun this tick
    duration_s: float  # how long the thing stays broken (0 for a reset)
    target: int = 0  # the shard (shard faults) or worker (worker faults) hit

    def __str__(self) -> str:
        where = f" shard {self.target}" if self.kind in (SHARD_KILL, PARTITION, PROXY_RESET, PROXY_STALL) else ""
        return f"{self.kind}{where} at tick {self.tick} for {self.duration_s:.1f} s"


@dataclass(frozen=True)
class Input:
    tick: int  # published once every shard has begun this tick
    player: str
    to: int  # index into the world's NPC ids (the runner resolves it)
    text: str


@dataclass(frozen=True)
class WorldChange:
    tick: int
    key: str
    value: str


@dataclass(frozen=True)
class Schedule:
    seed: int
    world: str  # "village" or "generated"
    shards: int
    ticks: int
    workers: int  # remote workers (0: in-process inference)
    faults: tuple[Fault, ...]
    inputs: tuple[Input, ...]
    world_changes: tuple[WorldChange, ...] = field(default=())

    @property
    def model_faults(self) -> bool:
        return any(f.kind in MODEL for f in self.faults)

    @property
    def netns(self) -> bool:
        """Whether a shard runs in its own network namespace (a partition is drawn)."""
        return any(f.kind == PARTITION for f in self.faults)

    @property
    def proxied(self) -> bool:
        return any(f.kind in (PROXY_RESET, PROXY_STALL) for f in self.faults)

    def describe(self) -> str:
        head = f"seed {self.seed}: {self.world}, {self.shards} shard(s), {self.ticks} ticks, {self.workers} worker(s)"
        faults = "; ".join(str(f) for f in self.faults) or "no faults"
        said = ", ".join(f"t{i.tick} {i.player}->#{i.to}" for i in self.inputs)
        world = ", ".join(f"t{w.tick} {w.key}={w.value}" for w in self.world_changes)
        return f"{head}\n  faults: {faults}\n  inputs: {said or 'none'}\n  world: {world or 'none'}"


def draw(
    seed: int,
    *,
    world: str | None = None,
    shards: int | None = None,
    ticks: int | None = None,
    kinds: Sequence[str] = KINDS,
) -> Schedule:
    """The schedule of `seed`; `world`, `shards`, `ticks` and `kinds` pin what the caller fixes."""
    rng = random.Random(f"npcsim-faults-{seed}")
    world = world or rng.choice(("village", "generated"))
    shards = shards or rng.randint(1, 3)
    ticks = ticks or rng.randint(20, 30)
    allowed = [k for k in kinds if k in KINDS]
    # what one runner can do at once: a shard in a namespace cannot reach the loopback proxy or
    # the loopback model server, so a schedule uses the namespace, the proxy or the model server
    network = rng.choice((PARTITION, PROXY_RESET))
    if any(k in MODEL for k in allowed) and rng.random() < 0.3:
        allowed = [k for k in allowed if k not in (PARTITION, PROXY_RESET, PROXY_STALL, WORKER_KILL)]
    else:
        allowed = [k for k in allowed if k not in MODEL]
        banned = (PROXY_RESET, PROXY_STALL) if network == PARTITION else (PARTITION,)
        allowed = [k for k in allowed if k not in banned]
    net_target = rng.randrange(shards)  # the one shard behind the namespace or the proxy
    count = rng.randint(1, 3) if allowed else 0
    faults: list[Fault] = []
    tick = FIRST + rng.randrange(GAP)
    weights = [3 if k == SHARD_KILL else 1 for k in allowed]  # the kill -9 that can lose the most
    while len(faults) < count and tick < ticks - TAIL:
        kind = rng.choices(allowed, weights)[0]
        target = net_target if kind in (PARTITION, PROXY_RESET, PROXY_STALL) else rng.randrange(shards)
        duration = 0.0 if kind == PROXY_RESET else round(rng.uniform(0.5, _longest(kind, shards)), 1)
        faults.append(Fault(kind, tick, duration, target))
        tick += GAP + rng.randrange(GAP)
    workers = 2 if any(f.kind == WORKER_KILL for f in faults) else 0
    inputs = tuple(
        Input(tick=t, player=f"p{seed % 100}x{n}", to=rng.randrange(1 << 16), text=f"Seed {seed} asks {n}: any news?")
        for n, t in enumerate(sorted(rng.sample(range(1, ticks - TAIL - 1), k=4)))
    )
    # two inputs in the tick of every shard kill: one published in the tick before (taken at
    # the start of the killed tick), one the moment before the kill (arrived, not yet taken)
    inputs += tuple(
        Input(tick=f.tick - lead, player=f"k{seed % 100}x{n}{'ba'[lead]}", to=rng.randrange(1 << 16),
              text=f"Seed {seed} at the kill {n}{'ba'[lead]}")
        for n, f in enumerate(faults) if f.kind == SHARD_KILL for lead in (1, 0)
    )
    changes = tuple(
        WorldChange(tick=t, key=f"omen{n}", value=f"seed {seed} sign {n}")
        for n, t in enumerate(sorted(rng.sample(range(2, ticks - TAIL - 1), k=2)))
    )
    return Schedule(seed, world, shards, ticks, workers, tuple(faults), inputs, changes)


def _longest(kind: str, shards: int) -> float:
    """Up to 10 s for a fault the tick barrier waits out (every shard holds while one is away);
    up to 3 s for one the run goes on through (one shard alone, a worker, the model server),
    so that the rest of the schedule still finds the run going."""
    held = shards > 1 and kind in (BROKER_KILL, SHARD_KILL, PARTITION, PROXY_STALL)
    return MAX_DURATION_S if held else UNHELD_S
