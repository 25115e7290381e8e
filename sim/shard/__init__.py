"""A shard of a run: its configuration, clock, agents' contexts, recorder, start-up and tick loop.

    stats = await run(RunConfig(scenario="scenarios/village.toml", ticks=20))   # one shard, as a process

    plan = ShardPlan(config, scenario, run_id=run_id, seed=seed)
    async with open_shard(plan, db, stats=stats, stop=stop) as shard:
        await shard.start()
        await shard.step(shard.next_tick)    # one whole tick: inputs, turns, publish, barrier, perceive, commit
        await shard.run(until=shard.end)     # the rest, paced by tick_ms

The modules, one job each:
- `_run_config`: `RunConfig` in its parts (broker, inference and its placement, limits, record) and what
  follows from it (shards, their NPCs, the hot window);
- `_place_shares`: which shard holds which place (whole places, balanced by NPC count);
- `_stats`: `RunStats`, what the display, the summary and the metrics read; `RunStarted`;
- `_clock`: `Clock`, `SystemClock`, `VirtualClock`: every wait of the shard;
- `_layout`: `ShardLayout`, what a shard holds (its NPCs, their kinds, its places, the
  dice table), built off the event loop at start-up;
- `_whereabouts`: `Whereabouts`, where every NPC of the run stands and what it does (routines,
  `go_to`, the game's moves), and which shards hear each place;
- `_moves`: `Movements`, the moves at the start of a tick and the hearing that moves with them;
- `_plan`: `ShardPlan`, what a shard is before anything opens (config, scenario, run id, seed,
  layout, its places' topics): every phase reads it;
- `_context`: `ShardContext` (what the agents share) and `AgentContext` (what an agent may do);
- `_window`, `_perception`: shared perception: a place's log, trimmed by the window rule, and
  the listeners' memories merged from it;
- `_recorder`: audit records, traces, metrics and counters of every line said;
- `_prefix`: `PrefixSketches`, how much of a prompt the NPC's previous one holds, from a sketch;
- `_registry`: agent and player kinds by import string (`sim` never imports `agents`);
- `_dice`: the ambient dice, rolled by the shard for all its NPCs in one loop;
- `_inputs`: the tick's inputs (phase 1), `InputSource`, the live one and a recorded run's
  (`RecordedInputs`, for sim.replay), what every shard applies at one tick (`RunWideInputs`);
- `_turns`: the tick's turns (phase 2), taken by a bounded set of workers;
- `_exchange`: publish and the barrier (phases 3 and 4), the status topic;
- `_intake`: what the bus hands over, to the part that owns it;
- `_startup`: start-up at scale (parse off the loop, agents in chunks, progress);
- `_parse_child`: the helper process that parses a large scenario for `_startup`;
- `_loop`: `Shard`, the tick loop: its six phases, start, resume;
- `_trust`: the run key and the trust announcements at start;
- `_instance`: the run instance a shard belongs to (its store's identity, the run nonce);
- `_wiring`: `open_shard(plan, db, ...)`, a Shard with its store, bus, pool and context, assembled in
  one place from its parts (`Connection`, `Seams`);
- `_process`: `run(config)`, the broker and the signals around `open_shard`.
"""

from sim.shard._clock import Clock, SystemClock, VirtualClock
from sim.shard._context import AgentContext, MemoryConfigOf, ShardContext
from sim.shard._dice import ambient_roll
from sim.shard._inputs import RecordedInputs
from sim.shard._loop import Shard
from sim.shard._place_shares import assign_places
from sim.shard._plan import ShardPlan
from sim.shard._process import run
from sim.shard._registry import AGENT_KINDS, PLAYER_KINDS, Agent, Player
from sim.shard._run_config import (
    BrokerConfig,
    InferenceConfig,
    Limits,
    Placement,
    RecordConfig,
    RunConfig,
    hot_limit,
    parse_shard,
    shard_npcs,
)
from sim.shard._startup import PausedCollector, StartupPhase, StartupProgress, create_agents
from sim.shard._stats import RunStarted, RunStats
from sim.shard._whereabouts import Moved, Whereabouts
from sim.shard._wiring import Claim, Connection, Seams, open_shard

__all__ = [
    "AGENT_KINDS",
    "PLAYER_KINDS",
    "Agent",
    "AgentContext",
    "BrokerConfig",
    "Claim",
    "Clock",
    "Connection",
    "InferenceConfig",
    "Limits",
    "MemoryConfigOf",
    "PausedCollector",
    "Placement",
    "Player",
    "RecordConfig",
    "RecordedInputs",
    "Seams",
    "RunConfig",
    "RunStarted",
    "RunStats",
    "Shard",
    "ShardContext",
    "ShardPlan",
    "StartupPhase",
    "StartupProgress",
    "SystemClock",
    "VirtualClock",
    "ambient_roll",
    "Moved",
    "Whereabouts",
    "assign_places",
    "create_agents",
    "hot_limit",
    "open_shard",
    "parse_shard",
    "run",
    "shard_npcs",
]
