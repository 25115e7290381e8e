"""What a broker retained is not taken again: player input never, an earlier run's world state not silently."""

from __future__ import annotations

import logging
from pathlib import Path

import aiomqtt
import pytest

from sim.shard import BrokerConfig, RecordConfig, RunConfig, run
from sim.store import open_reader, open_store
from sim.wire import topics
from tests.helpers import VILLAGE, MosquittoProcess, audit

pytestmark = pytest.mark.mosquitto


async def retain(mosquitto: MosquittoProcess, topic: str, payload: bytes) -> None:
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
        await client.publish(topic, payload, qos=1, retain=True)


async def test_a_retained_player_input_is_ignored_and_counted_at_every_start(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    db = tmp_path / "kept.db"
    await retain(mosquitto, topics.player_input("kept", "visitor"), b'{"to": "innkeeper", "text": "Kept for ever"}')
    first = await run(RunConfig(
        scenario=VILLAGE, run_id="kept", ticks=4, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db)),
    ))
    again = await run(RunConfig(
        scenario=VILLAGE, run_id="kept", ticks=4, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(db), resume=True),
    ))
    for stats in (first, again):
        assert stats.bus is not None and stats.bus.refused.get("retained player input") == 1
    async with open_store(db) as store:
        assert [i for tick in range(8) for i in await store.resume.inputs(tick)] == []
    with open_reader(db) as reader:
        assert not any("Kept for ever" in a.prompt for r in reader.audit_records() for a in r.attempts)


async def test_a_retained_world_state_of_an_earlier_run_does_not_change_a_fresh_run(
    mosquitto: MosquittoProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def config(db: Path, *, resume: bool = False) -> RunConfig:
        return RunConfig(scenario=VILLAGE, broker=BrokerConfig(url=mosquitto.url), run_id="crown", ticks=30,
                         record=RecordConfig(db=str(db), resume=resume))

    earlier = await run(config(tmp_path / "earlier.db"))  # leaves the scenario's world state retained
    assert earlier.bus is not None and "retained world state" not in earlier.bus.refused
    await retain(mosquitto, topics.world_state("crown"), b'{"state": {"king": "crowned: Queen Ysolde"}}')
    caplog.set_level(logging.WARNING)
    fresh = await run(config(tmp_path / "fresh.db"))
    assert fresh.world_changes == 0
    assert fresh.bus is not None and fresh.bus.refused.get("retained world state") == 1
    assert "mosquitto_pub -r -n -t npcsim/crown/world/state" in caplog.text
    assert audit(tmp_path / "fresh.db") == audit(tmp_path / "earlier.db")  # same seed, same dialogue
    with open_reader(tmp_path / "fresh.db") as reader:
        assert not any("Queen Ysolde" in a.prompt for r in reader.audit_records() for a in r.attempts)
    quiet = await run(config(tmp_path / "earlier.db", resume=True))  # the fresh run's own state: nothing to say
    assert quiet.bus is not None and not quiet.bus.refused
    await retain(mosquitto, topics.world_state("crown"), b'{"state": {"king": "crowned: Queen Ysolde"}}')
    resumed = await run(config(tmp_path / "earlier.db", resume=True))  # a resume holds what it applied
    assert resumed.world_changes == 0 and resumed.bus is not None
    assert resumed.bus.refused.get("retained world state") == 1
