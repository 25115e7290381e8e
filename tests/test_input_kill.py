"""Outside input the broker delivered is never lost to kill -9, and a resume takes it at its tick.

A one-shard village run on a real Mosquitto, as a child process: two players speak to the
innkeeper and the game system changes the world state; as soon as the shard has all three
(its arrivals journal beside the store, sim.store._arrivals, holds them) it is killed -9,
and started again with --resume to the same horizon. Both inputs are in the store (inputs
published = inputs stored), stamped with the ticks the journal gave them, and answered;
the world-state change is applied; and the audit is the one of a run
that was never killed and got the same inputs at the same ticks (stopped cleanly before
that tick, given the inputs there, and run on).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import aiomqtt
import pytest

from sim.protocol.outside import InputArrival, OutsideInput
from sim.store import arrivals_path, open_reader, open_store, read_arrivals
from sim.wire import topics
from tests.helpers import VILLAGE, MosquittoProcess, audit, committed_tick, eventually, start_npcsim

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(400)]

RUN = "inputs"
HORIZON = 40
SAID = {"visitor": "A room for the night, please.", "ghost": "Who sleeps in the cellar?"}
WORLD = {"weather": "a storm from the north"}


def stored_inputs(db: Path) -> list[tuple[int, str, str, str]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT tick, "
                 "input ->> 'player', input ->> 'to', input ->> 'text' FROM inputs ORDER BY tick, seq").fetchall()
    return [(int(t), str(p), str(a), str(x)) for t, p, a, x in rows]


def world_value(db: Path, agent: str, key: str) -> str | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT value FROM world WHERE agent = ? AND key = ?", (agent, key)).fetchone()
    return None if row is None else str(row[0])


async def npcsim_run(mosquitto: MosquittoProcess, db: Path, log: Path, *extra: str) -> asyncio.subprocess.Process:
    with log.open("ab") as err:
        return await start_npcsim(
            "run", VILLAGE, "--broker", mosquitto.url, "--run-id", RUN, "--tick-ms", "400", "--db", str(db),
            "--quiet", *extra, stdout=asyncio.subprocess.DEVNULL, stderr=err,
        )


async def finished(proc: asyncio.subprocess.Process, log: Path) -> None:
    async with asyncio.timeout(180):
        code = await proc.wait()
    assert code == 0, log.read_text()[-2000:]  # noqa: ASYNC240 - the failure message


async def test_input_delivered_in_a_killed_tick_is_stored_answered_and_taken_at_its_tick(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    db, log = tmp_path / "killed.db", tmp_path / "killed.log"
    proc = await npcsim_run(mosquitto, db, log, "--until-tick", str(HORIZON))
    try:
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await eventually(lambda: committed_tick(db) >= 5, what="the run getting going", within=120)
            # right after a commit: the shard waits out --tick-ms before the next tick, so
            # the kill below comes before any tick that takes the inputs can commit
            at = committed_tick(db)
            await eventually(lambda: committed_tick(db) > at, what="the next commit", within=60, every=0.002)
            for player, text in SAID.items():
                await client.publish(topics.player_input(RUN, player), f'{{"to": "innkeeper", "text": "{text}"}}',
                                     qos=1)
            await client.publish(topics.world_state(RUN), json.dumps({"state": WORLD}), qos=1)
        arrived = await eventually(lambda: (j := read_arrivals(db, committed_tick(db))) and len(j) == 3 and j,
                                   what="the three inputs in the shard's journal", within=60, every=0.002)
        proc.kill()  # kill -9 as soon as the shard has them: its tick is not committed
        await proc.wait()
        killed_after = committed_tick(db)
        stamps = {a.input.player: a.tick for a in arrived
                  if isinstance(a, InputArrival) and isinstance(a.input, OutsideInput)}
        assert all(a.tick > killed_after for a in arrived), (arrived, killed_after)  # no committed tick has them
        assert world_value(db, "innkeeper", "weather") is None
        proc = await npcsim_run(mosquitto, db, log, "--until-tick", str(HORIZON), "--resume")
        await finished(proc, log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    inputs = stored_inputs(db)
    assert sorted((p, t) for _, p, _, t in inputs) == sorted(SAID.items())  # inputs published = inputs stored
    assert {p: t for t, p, _, _ in inputs} == stamps  # at the ticks they were stamped with on arrival
    with open_reader(db) as reader:
        heard = {r.player_input for r in reader.audit_records() if r.agent_id == "innkeeper"}
    assert all(any(text in h for h in heard) for text in SAID.values()), "an input was not answered"
    assert world_value(db, "innkeeper", "weather") == WORLD["weather"]
    assert not arrivals_path(db).read_bytes(), "the journal keeps what committed ticks hold"

    # the same inputs at the same ticks in a run never killed: stopped cleanly before the
    # first of those ticks, the inputs given there, run on to the horizon
    calm, calm_log = tmp_path / "calm.db", tmp_path / "calm.log"
    first = min(a.tick for a in arrived)
    await finished(await npcsim_run(mosquitto, calm, calm_log, "--until-tick", str(first)), calm_log)
    async with open_store(calm) as store:
        for a in arrived:
            store.arrivals.add(a)
    await finished(await npcsim_run(mosquitto, calm, calm_log, "--until-tick", str(HORIZON), "--resume"), calm_log)
    assert stored_inputs(calm) == inputs
    assert world_value(calm, "innkeeper", "weather") == WORLD["weather"]
    expected, got = audit(calm), audit(db)
    assert expected == got, f"{len(expected - got)} records missing, {len(got - expected)} different"
    print(f"\ninputs {stamps} (killed after tick {killed_after}): stored, answered, {len(got)} audit records "
          "identical to the run never killed")
