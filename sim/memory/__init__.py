"""The pure core: NPC state, ephemeral working memory with priority truncation.

No I/O happens here, and nothing here imports the I/O layers.
"""

from sim.errors import OverBudgetError
from sim.memory._build import CategoryReport, TruncationReport, WorkingMemory, build_working_memory
from sim.memory._config import WorkingMemoryConfig
from sim.memory._render import RENDERER_VERSION, inert
from sim.memory._state import (
    Belief,
    Episode,
    Fact,
    Line,
    NpcState,
    WorldFact,
    belief_order,
    episode_order,
    fact_order,
    line_order,
    world_order,
)

__all__ = [
    "Belief",
    "CategoryReport",
    "Episode",
    "Fact",
    "Line",
    "NpcState",
    "OverBudgetError",
    "RENDERER_VERSION",
    "TruncationReport",
    "WorkingMemory",
    "WorkingMemoryConfig",
    "WorldFact",
    "belief_order",
    "build_working_memory",
    "episode_order",
    "fact_order",
    "inert",
    "line_order",
    "world_order",
]
