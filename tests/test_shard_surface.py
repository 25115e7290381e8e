"""The public surfaces of the shard, the bus and the protocol, pinned; sim.runner still says what it said."""

from __future__ import annotations

import sim.bus
import sim.runner
import sim.shard


def test_the_shard_exports_exactly_its_public_names() -> None:
    assert set(sim.shard.__all__) == {
        "AGENT_KINDS", "PLAYER_KINDS", "Agent", "AgentContext", "Clock", "Player", "RunConfig", "RunStats", "Shard",
        "ShardContext", "StartupPhase", "StartupProgress", "SystemClock", "VirtualClock", "ambient_roll",
        "assign_places", "create_agents", "hot_limit", "parse_shard", "run", "shard_npcs",
    }
    for name in sim.shard.__all__:
        assert getattr(sim.shard, name) is not None


def test_the_runner_re_exports_what_it_exported_before_the_shard_package() -> None:
    assert set(sim.runner.__all__) == {
        "AGENT_KINDS", "Agent", "Clock", "RunConfig", "RunStats", "Shard", "ShardContext", "SystemClock",
        "hot_limit", "parse_shard", "run", "shard_npcs",
    }
    for name in sim.runner.__all__:
        assert getattr(sim.runner, name) is getattr(sim.shard, name)


def test_the_bus_exports_exactly_its_public_names() -> None:
    assert set(sim.bus.__all__) == {
        "Bus", "BusConfig", "BusEvent", "BusStats", "Connected", "Link", "Mailbox", "MqttTransport", "Transport",
        "open_bus",
    }
