"""Outside input the broker delivered is never lost to kill -9, and a resume takes it at its tick.

A one-shard village run on a real Mosquitto, as a child process: two players speak to the
innkeeper, and the game system changes the world state, puts the visitor at the inn and
adds a fact for every NPC; as soon as the shard has all five (its arrivals journal beside
the store, sim.store._arrivals, holds them) it is killed -9, in the tick the inputs began
before the pace (an early tick, its answers slowed down), and started again with
--resume to the same horizon. Both inputs are in the store (inputs published = inputs
stored), stamped with the ticks the journal gave them, and answered; the world-state
change, the presence and the fact take effect at the tick after the one whose TickDone
they were stamped with (as on every shard of a run of several); and the audit is the one
of a run that was never killed and got the same inputs at the same ticks (stopped cleanly
before that tick, given the inputs there, and run on).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import aiomqtt
import msgspec
import pytest

from sim.protocol.outside import InputArrival, RunWideArrival
from sim.store import arrivals_path, open_reader, open_store, read_arrivals
from sim.wire import topics
from sim.wire.inputs import GameFact, OutsideInput, Presence, Taken
from tests.helpers import VILLAGE, MosquittoProcess, audit, committed_tick, eventually, start_npcsim

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(400)]

RUN = "inputs"
HORIZON = 40
SAID = {"visitor": "A room for the night, please.", "ghost": "Who sleeps in the cellar?"}
WORLD = {"weather": "a storm from the north"}
FACT = {"id": "bard", "text": "A bard named Osric sings at the inn tonight."}
ANSWER_MS = 1000
"""Each scripted answer's delay: the tick that takes the inputs begins at once (early) and
answers them, so it is still under way, uncommitted, when the kill comes."""


def stored_inputs(db: Path) -> list[tuple[int, Taken]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT tick, input FROM inputs ORDER BY tick, seq").fetchall()
    return [(int(t), msgspec.json.decode(x, type=Taken)) for t, x in rows]


def fact_text(db: Path, agent: str, fact: str) -> str | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT text FROM facts WHERE agent = ? AND id = ?", (agent, fact)).fetchone()
    return None if row is None else str(row[0])


def world_value(db: Path, agent: str, key: str) -> str | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT value FROM world WHERE agent = ? AND key = ?", (agent, key)).fetchone()
    return None if row is None else str(row[0])


async def npcsim_run(mosquitto: MosquittoProcess, db: Path, log: Path, *extra: str) -> asyncio.subprocess.Process:
    with log.open("ab") as err:
        return await start_npcsim(
            "run", VILLAGE, "--broker", mosquitto.url, "--run-id", RUN, "--tick-ms", "400", "--db", str(db),
            "--set", f"inference.backend_options.delay_ms={ANSWER_MS}", "--quiet", *extra,
            stdout=asyncio.subprocess.DEVNULL, stderr=err,
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
            # right after a commit: the next tick begins as soon as the inputs are in (an early
            # tick), and answers them, each answer ANSWER_MS long, so the kill below comes
            # before the tick that takes them can commit
            at = committed_tick(db)
            await eventually(lambda: committed_tick(db) > at, what="the next commit", within=60, every=0.002)
            for player, text in SAID.items():
                await client.publish(topics.player_input(RUN, player), f'{{"to": "innkeeper", "text": "{text}"}}',
                                     qos=1)
            await client.publish(topics.world_state(RUN), json.dumps({"state": WORLD}), qos=1)
            await client.publish(topics.player_presence(RUN, "visitor"), b'{"location": "inn"}', qos=1)
            await client.publish(topics.game_fact(RUN), json.dumps(FACT), qos=1)
        arrived = await eventually(lambda: (j := read_arrivals(db, committed_tick(db))) and len(j) == 5 and j,
                                   what="the five inputs in the shard's journal", within=60, every=0.002)
        proc.kill()  # kill -9 as soon as the shard has them: its tick is not committed
        await proc.wait()
        killed_after = committed_tick(db)
        stamps = {a.input.player: a.tick for a in arrived
                  if isinstance(a, InputArrival) and isinstance(a.input, OutsideInput)}
        run_wide = {type(a.input).__name__: a.tick for a in arrived if isinstance(a, RunWideArrival)}
        assert all(a.tick > killed_after for a in arrived), (arrived, killed_after)  # no committed tick has them
        assert world_value(db, "innkeeper", "weather") is None
        assert sorted(run_wide) == ["GameFact", "Presence"]
        proc = await npcsim_run(mosquitto, db, log, "--until-tick", str(HORIZON), "--resume")
        await finished(proc, log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    inputs = stored_inputs(db)
    said = [(tick, t) for tick, t in inputs if isinstance(t, OutsideInput)]
    assert sorted((t.player, t.text) for _, t in said) == sorted(SAID.items())  # inputs published = inputs stored
    assert {t.player: tick for tick, t in said} == stamps  # at the ticks they were stamped with on arrival
    # presence and the fact: at the tick after the one whose TickDone took them, as on every shard
    assert [(type(t).__name__, tick) for tick, t in inputs if isinstance(t, Presence | GameFact)] == sorted(
        ((name, tick + 1) for name, tick in run_wide.items()), key=lambda x: (x[1], x[0] != "Presence"))
    assert all(fact_text(db, npc, "bard") == FACT["text"] for npc in ("innkeeper", "blacksmith", "guard_captain"))
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
    assert fact_text(calm, "snack_machine", "bard") == FACT["text"]
    expected, got = audit(calm), audit(db)
    assert expected == got, f"{len(expected - got)} records missing, {len(got - expected)} different"
    print(f"\ninputs {stamps} (killed after tick {killed_after}): stored, answered, {len(got)} audit records "
          "identical to the run never killed")
