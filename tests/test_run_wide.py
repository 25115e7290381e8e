"""What every shard applies (a player's presence, a fact for every NPC) takes effect at the
same tick on every shard, so a run split over two shards is the run on one.

The village on two shards on a real Mosquitto (shard 0 holds the square, shard 1 the inn
and the forge): the game system puts the visitor at the inn (shard 1's, though shard 0
takes the presence) and a pilgrim at the square, adds a fact for every NPC (and the same
again, refused with exactly one `exists`), then both players speak to an NPC where they
stand. Both stores hold the presence and the fact at one tick with one number; the audit
is the one of the same seeded run on one shard given the same inputs at the same ticks
(stopped cleanly before the first of them, given them in its arrivals journal, run on);
and `npcsim replay` of the two stores is identical.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import aiomqtt
import msgspec
import pytest

from sim.protocol.outside import Arrival, InputArrival, RunWideArrival
from sim.shard import BrokerConfig, RecordConfig, RunConfig, RunStats, run
from sim.store import open_reader, open_store
from sim.wire import topics
from sim.wire.events import ErrorMessage, decode_error
from sim.wire.inputs import GameFact, OutsideInput, Presence, Taken, is_run_wide
from tests.helpers import VILLAGE, MosquittoProcess, audit, eventually, npcsim_in_process

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(300)]

RUN = "wide"
END = 40
FACT = {"id": "bard", "text": "A bard named Osric sings at the inn tonight."}
SAID = {"visitor": ("innkeeper", "Is the ale any good tonight?"), "pilgrim": ("guard_captain", "Open the gate!")}


def config(db: Path, shard: str, until: int, url: str, *, resume: bool = False) -> RunConfig:
    return RunConfig(scenario=VILLAGE, run_id=RUN, until_tick=until, tick_ms=60, shard=shard,
                     broker=BrokerConfig(url=url), record=RecordConfig(db=str(db), resume=resume))


def taken(db: Path) -> list[tuple[int, Taken]]:
    """The outside inputs a store committed, with their ticks (read while its writer runs)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
        rows = conn.execute("SELECT tick, input FROM inputs ORDER BY tick, seq").fetchall()
    return [(int(tick), msgspec.json.decode(text, type=Taken)) for tick, text in rows]


def arrivals(inputs: list[tuple[int, Taken]]) -> list[Arrival]:
    """The arrivals a shard journals for these inputs: a run-wide one for the TickDone of the
    tick before the one that took it, another for the tick that took it."""
    return [RunWideArrival(tick=tick - 1, input=t) if is_run_wide(t) else InputArrival(tick=tick, input=t)
            for tick, t in inputs]


async def two_shards(mosquitto: MosquittoProcess, dbs: list[Path]) -> list[ErrorMessage]:
    """The run on two shards, the game system's and the players' messages published while it
    goes; the errors on game/error."""
    stats = [RunStats() for _ in dbs]
    errors: list[ErrorMessage] = []
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client, asyncio.TaskGroup() as group:
        await client.subscribe(topics.game_error(RUN), qos=1)

        async def read() -> None:
            async for message in client.messages:
                errors.append(decode_error(bytes(message.payload)))  # type: ignore[arg-type]

        reader = group.create_task(read())
        jobs = [group.create_task(run(config(db, f"{i}/2", END, mosquitto.url), stats=s))
                for i, (db, s) in enumerate(zip(dbs, stats, strict=True))]
        await eventually(lambda: min(s.tick for s in stats) >= 5, what="the run under way", within=120)
        await client.publish(topics.player_presence(RUN, "visitor"), b'{"location": "inn"}', qos=1)
        await client.publish(topics.player_presence(RUN, "pilgrim"), b'{"location": "square"}', qos=1)
        await client.publish(topics.game_fact(RUN), json.dumps(FACT), qos=1)
        await client.publish(topics.game_fact(RUN), json.dumps({**FACT, "text": "Another text"}), qos=1)
        await eventually(lambda: all(sum(isinstance(t, Presence) for _, t in taken(db)) == 2 for db in dbs),
                         what="both presences committed by both shards", within=60)
        for n, (player, (npc, text)) in enumerate(SAID.items(), start=1):  # one a tick
            await client.publish(topics.player_input(RUN, player), json.dumps({"to": npc, "text": text}), qos=1)
            await eventually(lambda n=n: sum(isinstance(t, OutsideInput) for db in dbs for _, t in taken(db)) == n,
                             what=f"{player}'s words committed", within=60)
        await asyncio.gather(*jobs)
        await eventually(lambda: errors, what="the refused fact's error", within=30)
        reader.cancel()
    assert all(s.tick == END - 1 for s in stats), "the run stopped early (a slow machine: lower tick_ms)"
    return errors


async def test_two_shards_take_presence_and_a_fact_for_every_npc_at_one_tick_as_one_shard_does(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dbs = [tmp_path / f"two-{i}.db" for i in range(2)]
    errors = await two_shards(mosquitto, dbs)
    assert [(e.code, e.id) for e in errors] == [("exists", "bard")]  # one reply, shard 0's

    zero, one = taken(dbs[0]), taken(dbs[1])
    wide = [(tick, t) for tick, t in zero if is_run_wide(t)]
    assert wide == [(tick, t) for tick, t in one if is_run_wide(t)]  # one tick, one number on both
    assert sorted(type(t).__name__ for _, t in wide) == ["GameFact", "Presence", "Presence"]
    fact_tick = next(tick for tick, t in wide if isinstance(t, GameFact))
    said = sorted((t.player, t.to) for _, t in zero + one if isinstance(t, OutsideInput))
    assert said == sorted((p, npc) for p, (npc, _) in SAID.items())
    for db in dbs:
        with open_reader(db) as reader:
            later = [r.memory().prompt for r in reader.audit_records() if r.tick > fact_tick]
        assert later and all(FACT["text"] in prompt for prompt in later), f"{db.name}: the fact is not in every prompt"
    two = audit(dbs[0]) | audit(dbs[1])

    # the same seeded run on one shard, given the same inputs at the same ticks
    inputs = sorted(wide + [(tick, t) for tick, t in zero + one if not is_run_wide(t)], key=lambda x: (x[0], x[1].seq))
    journal = arrivals(inputs)
    first = min(a.tick for a in journal)
    single = tmp_path / "one.db"
    await run(config(single, "0/1", first, mosquitto.url))
    async with open_store(single) as store:
        for arrival in journal:
            store.arrivals.add(arrival)
    await run(config(single, "0/1", END, mosquitto.url, resume=True))
    assert taken(single) == inputs
    expected = audit(single)
    assert two == expected, f"{len(expected - two)} records missing, {len(two - expected)} different"

    ran = await asyncio.to_thread(npcsim_in_process, capsys, "replay", "--db", str(dbs[1]), "--db", str(dbs[0]))
    assert ran.code == 0, ran.err
    assert ran.out.strip() == f"identical: {len(two)} records, 4 NPCs, {END} ticks"
    print(f"\npresence and the fact at tick {fact_tick} on both shards; {len(two)} audit records identical "
          "to one shard's, and the replay")
