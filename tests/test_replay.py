"""`npcsim replay`: a recorded run executed again from its stores is the same run, and a fork of it
is the same run up to its tick.

The originals run on a real Mosquitto with the village's scripted players, an outside
player's input and a world-state change published on their topics while the run goes (the
input begins its tick before the pace and is answered in it); the re-executions need no
broker. A reply changed in the store (SQL) and one NPC's dice changed (through `execute`'s
scenario hook) are each named as the first divergence, at their tick and NPC, found
independently here.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import aiomqtt
import msgspec
import pytest

from sim.replay import compare, execute, fork_report, load_recording, records_of
from sim.scenario import Scenario, parse_scenario
from sim.shard import BrokerConfig, InferenceConfig, RecordConfig, RunConfig, RunStats, ambient_roll, run
from sim.store import open_reader
from sim.wire import topics
from sim.wire.inputs import OutsideInput, Taken
from tests.audit_records import store_instead
from tests.helpers import TOWN, VILLAGE, MosquittoProcess, Ran, eventually, npcsim_in_process

pytestmark = [pytest.mark.mosquitto, pytest.mark.timeout(300)]

END = 60
VISITOR = b'{"to": "innkeeper", "text": "Is the ale any good tonight?"}'
WORLD = b'{"state": {"weather": "a storm from the north"}}'
EVENT = b'{"location": "inn", "text": "The fire in the hearth goes out.", "significance": 0.7}'
FACT = b'{"npc": "innkeeper", "id": "cellar", "text": "The cellar flooded in the storm."}'


async def original(mosquitto: MosquittoProcess, tmp_path: Path, shards: int = 1, *, scenario: str = VILLAGE,
                   end: int = END, messages: list[tuple[str, bytes]] | None = None) -> list[Path]:
    """The village (or `scenario`) to END (or `end`) on `shards` shards, with a player's input,
    a world-state change, an event at the inn and a fact for the innkeeper (or `messages`, as
    (topic, payload) of the run) published while it runs (each after the run is under way)."""
    run_id = f"orig{shards}"
    dbs = [tmp_path / f"{run_id}-{i}.db" for i in range(shards)]
    stats = [RunStats() for _ in dbs]
    configs = [RunConfig(
        scenario=scenario, run_id=run_id, until_tick=end, tick_ms=60, shard=f"{i}/{shards}",
        broker=BrokerConfig(url=mosquitto.url), record=RecordConfig(db=str(db)),
    ) for i, db in enumerate(dbs)]
    if messages is None:
        messages = [(topics.player_input(run_id, "visitor"), VISITOR), (topics.world_state(run_id), WORLD),
                    (topics.game_event(run_id), EVENT), (topics.game_fact(run_id), FACT)]
    async with asyncio.TaskGroup() as group:
        jobs = [group.create_task(run(c, stats=s)) for c, s in zip(configs, stats, strict=True)]
        await eventually(lambda: min(s.tick for s in stats) >= 5, what="the run under way", within=120)
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            for topic, payload in messages:
                await client.publish(topic, payload, qos=1)
        await asyncio.gather(*jobs)
    assert all(s.tick == end - 1 for s in stats), "the original stopped early (a slow machine: lower tick_ms)"
    if scenario == TOWN:
        assert sum(s.npc_moves for s in stats) > 10, "the town's NPCs did not walk"
    return dbs


async def replay_cli(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """`npcsim ARGS` in this process, in a thread: the command runs its own event loop."""
    return await asyncio.to_thread(npcsim_in_process, capsys, *args)


def held(dbs: list[Path]) -> tuple[list[tuple[int, Taken]], dict[int, dict[str, str]]]:
    inputs: list[tuple[int, Taken]] = []
    world: dict[int, dict[str, str]] = {}
    for db in dbs:
        with open_reader(db) as reader:
            inputs += reader.all_inputs()
            world.update(reader.world_changes() or {})
    return inputs, world


async def test_a_village_run_with_outside_input_and_a_world_change_replays_identical(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dbs = await original(mosquitto, tmp_path)
    inputs, world = held(dbs)
    assert [(i.player, i.to) for _, i in inputs if isinstance(i, OutsideInput)] == [("visitor", "innkeeper")], \
        "the outside input was not taken"
    assert {type(i).__name__ for _, i in inputs} == {"OutsideInput", "GameEvent", "GameFact"}
    assert any(state == {"weather": "a storm from the north"} for state in world.values()), world
    with open_reader(dbs[0]) as reader:
        records = len(list(reader.audit_records()))
        answered = [r for r in reader.audit_records("innkeeper") if r.player_input.startswith("visitor: ")]
    assert answered, "the innkeeper never answered the visitor"
    [asked] = [tick for tick, i in inputs if isinstance(i, OutsideInput)]
    assert [r.tick for r in answered] == [asked], "not answered in the tick that took it"
    ran = await replay_cli(capsys, "replay", "--db", str(dbs[0]))
    assert ran.code == 0, ran.err
    assert ran.out.strip() == f"identical: {records} records, 4 NPCs, {END} ticks"


async def test_a_three_shard_run_replays_identical_from_its_three_stores(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dbs = await original(mosquitto, tmp_path, shards=3)
    inputs = held(dbs)[0]
    assert len(inputs) == 3, "the outside input, the event and the fact were not all taken"
    [asked] = [tick for tick, i in inputs if isinstance(i, OutsideInput)]
    answered = [r.tick for r in records_of(dbs).values() if r.player_input.startswith("visitor: ")]
    assert answered == [asked], "not answered in the tick that took it, on the shard holding the inn"
    records = len(records_of(dbs))
    ran = await replay_cli(capsys, "replay", *(a for db in reversed(dbs) for a in ("--db", str(db))),
                            "--out", str(tmp_path / "again.db"))
    assert ran.code == 0, ran.err
    assert ran.out.strip() == f"identical: {records} records, 4 NPCs, {END} ticks"
    missing = await replay_cli(capsys, "replay", "--db", str(dbs[0]), "--db", str(dbs[2]))
    assert missing.code == 2 and "the stores of shard 1 are missing" in missing.err


async def test_a_town_where_npcs_walk_between_shards_replays_identical(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Routines, a `go_to` and a move and a goal from the game, on three shards: re-executed
    from the stores, every move is made again at its tick and the run is the same."""
    end = 30
    dbs = await original(mosquitto, tmp_path, 3, scenario=TOWN, end=end, messages=[
        (topics.game_move("orig3"), b'{"npc": "child", "location": "mill"}'),
        (topics.game_goal("orig3"), b'{"npc": "miller", "goal": "Sell ten sacks."}'),
    ])
    inputs = held(dbs)[0]
    assert {type(i).__name__ for _, i in inputs} == {"Move", "Goal"}, inputs
    records = len(records_of(dbs))
    ran = await replay_cli(capsys, "replay", *(a for db in dbs for a in ("--db", str(db))))
    assert ran.code == 0, ran.err
    assert ran.out.strip() == f"identical: {records} records, 8 NPCs, {end} ticks"


async def test_a_changed_reply_is_the_first_divergence(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    (db,) = await original(mosquitto, tmp_path)
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    # a line NPC's: a structured NPC's reply that is a bare line is no reply of its shape
    accepted = [r for r in records if not r.fallback and len(r.attempts) == 1 and r.output is None
                and 10 <= r.tick < END - 10]
    target = accepted[len(accepted) // 2]
    changed = msgspec.structs.replace(
        target, attempts=(msgspec.structs.replace(target.attempts[0], raw_response="Fine weather for it, friend."),),
    )
    store_instead(db, changed)
    recording = load_recording([db])
    executed = await execute(recording, tmp_path / "again.db")
    divergence = compare(recording, executed).divergence
    assert divergence is not None
    assert (divergence.tick, divergence.npc) == (target.tick, target.agent_id), divergence
    assert "Fine weather for it, friend." in divergence.what


async def test_one_npcs_dice_changed_is_the_first_divergence(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    (db,) = await original(mosquitto, tmp_path)
    recording = load_recording([db])
    scenario_seed = recording.identity.seed
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    by_npc: dict[str, set[int]] = {}
    for r in records:
        by_npc.setdefault(r.agent_id, set()).add(r.tick)
    npcs = parse_scenario(recording.scenario).npcs
    talker, chance = next((s.id, s.ambient_chance) for s in npcs if 0 < s.ambient_chance < 1
                          and any(o.location == s.location and o.id != s.id for o in npcs))
    # the first tick its dice did not fall and it said nothing: now it talks unprompted there
    expected = next(t for t in range(END) if ambient_roll(scenario_seed, talker, t) >= chance
                    and t not in by_npc[talker])

    def always_talks(scenario: Scenario) -> Scenario:
        npcs = [msgspec.structs.replace(s, ambient_chance=1.0) if s.id == talker else s for s in scenario.npcs]
        return msgspec.structs.replace(scenario, npcs=npcs)

    executed = await execute(recording, tmp_path / "again.db", alter=always_talks)
    divergence = compare(recording, executed).divergence
    assert divergence is not None
    assert (divergence.tick, divergence.npc) == (expected, talker), divergence
    assert "which the original did not" in divergence.what


async def test_a_fork_is_the_original_before_its_tick_and_differs_after(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (db,) = await original(mosquitto, tmp_path)
    fork_at = 30
    out = tmp_path / "fork.db"
    ran = await replay_cli(capsys, "replay", "--db", str(db), "--fork-at", str(fork_at), "--backend", "scripted",
                            "--set", 'inference.backend_options.script=["Aye, that it is."]', "--out", str(out))
    assert ran.code == 0, ran.err
    assert f"ticks 0-{fork_at - 1}: identical to the original" in ran.out
    assert "first divergence: tick " in ran.out
    before = {r.id: r for r in records_of([db]).values()}
    after = records_of([out])
    early = [r for r in before.values() if r.tick < fork_at]
    assert early and all(after[r.id].line == r.line for r in early)
    late = [r for r in after.values() if r.tick >= fork_at]
    assert late and all(r.line == "Aye, that it is." for r in late)
    assert any(before[r.id].line != r.line for r in late if r.id in before)
    report = fork_report(before, after, fork_at)
    assert report.before is None and report.first is not None and report.first.tick >= fork_at
    assert report.lines_differing > 0


async def test_a_fork_with_another_budget_changes_what_the_npcs_see_from_its_tick_on(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (db,) = await original(mosquitto, tmp_path)
    fork_at, out = 30, tmp_path / "fork.db"
    ran = await replay_cli(capsys, "replay", "--db", str(db), "--fork-at", str(fork_at), "--backend", "scripted",
                            "--set", "memory.max_context_chars=700", "--set", "npc.innkeeper.memory.max_beliefs=1",
                            "--out", str(out))
    assert ran.code == 0, ran.err
    assert f"ticks 0-{fork_at - 1}: identical to the original" in ran.out
    before, after = records_of([db]), records_of([out])
    recorded = next(iter(before.values())).config.max_context_chars
    beliefs = next(iter(before.values())).config.max_beliefs
    assert recorded != 700 and beliefs != 1
    for r in after.values():
        expected = recorded if r.tick < fork_at else 700
        assert r.config.max_context_chars == expected, r.id
        if r.tick >= fork_at:
            assert r.config.max_beliefs == (1 if r.agent_id == "innkeeper" else beliefs), r.id
            assert r.report.prompt_chars <= 700 or r.report.over_budget, r.id
    assert all(after[k].prompt_sha256 == r.prompt_sha256 for k, r in before.items() if r.tick < fork_at)
    late = [k for k, r in after.items() if r.tick >= fork_at and k in before]
    assert any(after[k].prompt_sha256 != before[k].prompt_sha256 for k in late)
    swept = await replay_cli(capsys, "replay", "--db", str(db), "--fork-at", "30", "--backend", "scripted",
                             "--set", "memory.max_context_chars=700,900")
    assert swept.code == 2 and "a fork goes on with one setting, not 2" in swept.err


async def test_bad_inputs_each_get_one_line(
    mosquitto: MosquittoProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (db,) = await original(mosquitto, tmp_path)

    async def refused(*args: str) -> str:
        ran = await replay_cli(capsys, "replay", *args)
        assert ran.code == 2, (args, ran)
        assert ran.err.count("\n") == 1, ran.err
        return ran.err

    assert "no such file" in await refused("--db", str(tmp_path / "none.db"))
    text = tmp_path / "notes.txt"
    text.write_text("not a store at all, but long enough to have a header of a hundred bytes " * 3)
    assert "not an SQLite database" in await refused("--db", str(text))
    assert "the run holds ticks 0 to 59" in await refused("--db", str(db), "--until-tick", "99")
    assert "give --fork-at" in await refused("--db", str(db), "--backend", "scripted")
    assert "report a what-if" in await refused("--db", str(db), "--json", str(tmp_path / "w.json"))
    assert "executes nothing" in await refused("--db", str(db), "--set", "memory.max_context_chars=700",
                                               "--out", "x.db")
    other = tmp_path / "other.db"
    await run(RunConfig(
        scenario=VILLAGE, run_id="other", ticks=3, broker=BrokerConfig(url=mosquitto.url),
        record=RecordConfig(db=str(other)),
    ))
    assert "belongs to run other" in await refused("--db", str(db), "--db", str(other))
    tampered = tmp_path / "tampered.db"
    tampered.write_bytes(db.read_bytes())
    with sqlite3.connect(tampered) as conn:
        conn.execute("UPDATE scenario SET data = CAST('[scenario]' AS BLOB)")
    assert "is not the one its run read" in await refused("--db", str(tampered))
    old = tmp_path / "old.db"
    old.write_bytes(db.read_bytes())
    with sqlite3.connect(old) as conn:  # an identity without the run's settings
        identity = json.loads(conn.execute("SELECT identity FROM run").fetchone()[0])
        del identity["settings"]
        conn.execute("UPDATE run SET identity = ?", (json.dumps(identity),))
    assert "it lacks the run's settings (its run was first started" in await refused("--db", str(old))
    with sqlite3.connect(old) as conn:
        conn.execute("DELETE FROM scenario")
    assert "it lacks the run's settings and the scenario's text" in await refused("--db", str(old))
    with sqlite3.connect(old) as conn:
        conn.execute("PRAGMA user_version = 6")
    assert "store schema 6 was written by an earlier npcsim" in await refused("--db", str(old))
    until = await replay_cli(capsys, "replay", "--db", str(db), "--until-tick", "20")
    assert until.code == 0 and until.out.startswith("identical: ") and "20 ticks" in until.out



async def test_a_final_state_changed_in_the_store_is_named(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    """The audit alone would not see it: the records keep their own snapshots."""
    (db,) = await original(mosquitto, tmp_path)
    with sqlite3.connect(db) as conn:
        tick, = conn.execute("SELECT max(tick) FROM dialogue WHERE agent = 'innkeeper'").fetchone()
        conn.execute("UPDATE dialogue SET text = 'a line never said' WHERE agent = 'innkeeper' AND tick = ?", (tick,))
    recording = load_recording([db])
    comparison = compare(recording, await execute(recording, tmp_path / "again.db"))
    assert comparison.divergence is not None
    assert (comparison.divergence.npc, comparison.divergence.tick) == ("innkeeper", tick), comparison.divergence
    assert "final state, dialogue: gained" in comparison.divergence.what
    assert "lost" in comparison.divergence.what and "a line never said" in comparison.divergence.what


async def test_retries_and_fallbacks_are_answered_attempt_by_attempt(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """Rejected replies, their retries and the fallbacks they end in: each attempt given back in order."""
    db = tmp_path / "retries.db"
    script = ["*waves*", "Good evening.", "*nods*", "*shrugs*"]  # a retry that works, then one that does not
    await run(RunConfig(
        scenario=VILLAGE, run_id="retries", until_tick=40, broker=BrokerConfig(url=mosquitto.url),
        inference=InferenceConfig(backend_options={"script": script}), record=RecordConfig(db=str(db)),
    ))
    with open_reader(db) as reader:
        records = list(reader.audit_records())
    assert any(len(r.attempts) == 2 and not r.fallback for r in records), "no retry that worked"
    assert any(len(r.attempts) == 2 and r.fallback_reason == "rejected" for r in records), "no retry that failed"
    recording = load_recording([db])
    assert recording.settings.backend_options == {"script": script}
    comparison = compare(recording, await execute(recording, tmp_path / "again.db"))
    assert comparison.divergence is None, comparison.divergence
    assert comparison.records == len(records)


async def test_a_fork_goes_on_with_an_openai_compatible_server(mosquitto: MosquittoProcess, tmp_path: Path) -> None:
    from tests.fake_openai import open_fake_openai

    (db,) = await original(mosquitto, tmp_path)
    recording = load_recording([db])
    async with open_fake_openai(reply="Storm or no storm, the ale is good.") as server:
        executed = await execute(recording, tmp_path / "fork.db", fork_at=40, backend="openai",
                                 backend_options={"base_url": server.base_url, "model": "fake-2"})
        asked = len(server.requests)
    fork = records_of([executed.out])
    late = [r for r in fork.values() if r.tick >= 40]
    assert late and asked == len(late)
    assert {(r.backend, r.model, r.line) for r in late} == {("openai", "fake-2", "Storm or no storm, the ale is good.")}
    assert all(fork[k].line == r.line for k, r in recording.records.items() if r.tick < 40)
    with open_reader(executed.out) as reader:
        identity = reader.run_identity()
    assert identity is not None and identity.settings is not None
    assert (identity.settings.backend, identity.settings.model) == ("openai", "fake-2")
