"""`ShardPlan`: what one shard of a run is before anything opens, the part every other part reads.

The run's configuration and scenario, its id and seed, the shard's layout (sim.shard._layout)
and the topics of the run's places follow from the scenario and the flags alone: no store,
bus or pool is needed to know them, so the caller makes the plan (a process builds the layout
off the event loop) and hands it to `open_shard`, and each phase of the tick reads from it
what it needs.
"""

from __future__ import annotations

from collections.abc import KeysView

from sim.scenario import Scenario
from sim.shard._layout import ShardLayout
from sim.shard._run_config import RunConfig
from sim.wire import topics

__all__ = ["ShardPlan"]


class ShardPlan:
    """Shard `config.shard` of `scenario` in the run `run_id` with `seed`; `layout` is built
    when not given (tests, embedders)."""

    def __init__(self, config: RunConfig, scenario: Scenario, *, run_id: str, seed: int,
                 layout: ShardLayout | None = None) -> None:
        self.config = config
        self.scenario = scenario
        self.run_id = run_id
        self.seed = seed
        self.layout = layout or ShardLayout(scenario, config.shard, seed)
        self.shard = str(self.layout.index)
        self._location_topics = {loc.id: topics.location_events(run_id, loc.id) for loc in scenario.locations}
        self._places = {topic: place for place, topic in self._location_topics.items()}

    @property
    def locations(self) -> KeysView[str]:
        """Every place of the run, in any shard."""
        return self._location_topics.keys()

    def location_topic(self, location: str) -> str:
        return self._location_topics[location]

    def place_of(self, topic: str) -> str | None:
        """The place whose events `topic` carries, or None (not a place's topic of this run)."""
        return self._places.get(topic)
