"""NPCs that live: a day, routines, places they walk to, goals.

A small world on the in-memory broker and a virtual clock: the smith works at the forge from
8 and drinks at the inn from 18; a player stands at the forge and talks to her there. She
walks at her hours and says so on her location topic (retained); she answers at the forge
with her place and activity in her prompt (a scripted player's line is heard, and answered,
the tick after its script's); what she says there is not heard on the square
she left; what she heard on the square before she left stays hers. `go_to` walks her where
she may go, and is refused `intent_args` for a place that is not there or cannot be reached.
A goal the game sets is in every later prompt until replaced, then cleared. The town-day
world, where NPCs walk between places that different shards hold, gives the same audit
on 1, 2 and 3 shards. (Kill -9 during the town's moves with --resume, and broker outages,
are tests/test_same_run.py's `town` world; replay, tests/test_replay.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.scenario import load_scenario, parse_scenario
from sim.shard import RunConfig, RunStats, VirtualClock, assign_places
from sim.store import open_reader
from sim.view.stored import StoredRun
from sim.wire import topics
from sim.wire.events import decode_location
from sim.wire.inputs import Goal, Move
from tests.helpers import eventually
from tests.memory_broker import MemoryBroker
from tests.memory_shard import run_shards

pytestmark = pytest.mark.timeout(180)

RUN = "life"
WORLD = """
[scenario]
name = "walk"
seed = 3
ticks = 26
ticks_per_day = 24

[[locations]]
id = "square"
exits = ["forge", "inn"]

[[locations]]
id = "forge"

[[locations]]
id = "inn"

[[locations]]
id = "island"

[[npcs]]
id = "smith"
name = "Brenna"
location = "square"
system_prompt = "You are Brenna, the smith. Answer in one short line."
ambient_chance = 0.0
output = "structured"
intents = { go_to = { location = "string" } }
schedule = [
  { hour = 8, location = "forge", activity = "working the bellows", until = 20 },
  { hour = 20, location = "inn", activity = "drinking with friends", until = 23 },
]

[[npcs]]
id = "baker"
name = "Tom"
location = "square"
system_prompt = "You are Tom, the baker. Answer in one short line."
ambient_chance = 0.6

[[npcs]]
id = "keeper"
name = "Mara"
location = "inn"
system_prompt = "You keep the inn. Answer in one short line."
ambient_chance = 0.5

[[npcs]]
id = "drunk"
name = "Old Pete"
location = "inn"
system_prompt = "You are an old regular at the inn. Answer in one short line."
ambient_chance = 0.2

[[players]]
id = "p1"
location = "forge"
script = [
  { tick = 10, to = "smith", text = "What are you doing today?" },
  { tick = 12, to = "smith", text = "Meet me at the island." },
  { tick = 13, to = "smith", text = "Meet me at the moon." },
  { tick = 15, to = "smith", text = "Come to the inn." },
]
"""


async def walk(tmp_path: Path, scenario_text: str = WORLD, *, game: list[tuple[int, str, dict[str, object]]] = (),
               shards: int = 1, name: str = "walk") -> tuple[MemoryBroker, list[Path]]:
    """The world to its end on `shards` shards; `game` is (after tick, topic kind, message) the
    game publishes while it runs."""
    path = tmp_path / f"{name}.toml"
    path.write_text(scenario_text)
    scenario = load_scenario(path)
    broker = MemoryBroker(5, VirtualClock(autojump=0.005))
    stats = [RunStats(shard=str(i)) for i in range(shards)]
    dbs = [tmp_path / f"{name}-{i}.db" for i in range(shards)]
    configs = [RunConfig(scenario=str(path), run_id=RUN, shard=f"{i}/{shards}", tick_ms=50) for i in range(shards)]

    async def the_game() -> None:
        for after, kind, message in game:
            await eventually(lambda after=after: min(s.ticks_done for s in stats) > after,  # type: ignore[misc]
                             what=f"tick {after} done", every=0.001)
            topic = topics.game_goal(RUN) if kind == "goal" else topics.game_move(RUN)
            broker.publish(topic, json.dumps(message).encode())

    await run_shards(broker, scenario, configs, dbs, stats, the_game() if game else None)
    return broker, dbs


def moves_of(broker: MemoryBroker, npc: str) -> list[tuple[int, str, str]]:
    return [(m.tick, m.location, m.activity) for topic, payload in broker.published
            if topic == topics.agent_location(RUN, npc) for m in [decode_location(payload)]]


def records(dbs: list[Path], npc: str | None = None) -> list[tuple[int, str, str, object]]:
    """(tick, prompt, line, the accepted intent's args or None) of each inference, by tick."""
    out = []
    for db in dbs:
        with open_reader(db) as reader:
            for r in reader.audit_records(npc) if npc else reader.audit_records():
                attempt = r.attempts[-1]
                verdicts = [(p.code, p.args) for p in attempt.proposals if p.kind == "intent"]
                out.append((r.tick, attempt.prompt, r.line, verdicts))
    return sorted(out, key=lambda x: x[0])


async def test_an_npc_walks_at_its_hours_answers_there_and_is_heard_only_where_it_stands(tmp_path: Path) -> None:
    broker, dbs = await walk(tmp_path)
    moves = moves_of(broker, "smith")
    assert moves == [(8, "forge", "working the bellows"), (17, "inn", ""), (23, "square", "")], \
        "to the forge at 8; to the inn by go_to (test below), where her routine has her from 20; home at 23"
    smith = records(dbs, "smith")
    answer = next(r for r in smith if r[0] == 11)
    assert "- location: forge" in answer[1] and "- activity: working the bellows" in answer[1]
    assert "- time: day 1, 11:00" in answer[1]
    assert "p1: What are you doing today?" in answer[1]
    with open_reader(dbs[0]) as reader:  # what she said at the forge went to the forge, not to the square
        said = {r.line for r in reader.audit_records("smith") if 8 <= r.tick < 20}
    baker = records(dbs, "baker")
    assert baker and said
    assert not any(line in prompt for _, prompt, _, _ in baker for line in said), "the square heard the forge"
    before = [r for r in baker if r[0] < 8]
    assert before, "the baker never spoke on the square before she left"
    first_at_forge = next(r for r in smith if r[0] >= 8)
    assert any(line in first_at_forge[1] for _, _, line, _ in before), "what she heard on the square was lost"


async def test_go_to_walks_where_she_may_and_is_refused_elsewhere(tmp_path: Path) -> None:
    broker, dbs = await walk(tmp_path)
    smith = {r[0]: r for r in records(dbs, "smith")}
    assert "- places_you_can_go: inn, square" in smith[13][1], "the island has no exit: not listed"
    [(code, args)] = smith[13][3]
    assert code == "intent_args" and args == {"location": "island"}
    [(code, args)] = smith[14][3]
    assert code == "intent_args" and args == {"location": "moon"}
    [(code, args)] = smith[16][3]
    assert code == "ok" and args == {"location": "inn"}
    moves = moves_of(broker, "smith")
    assert (17, "inn", "") in moves, "go_to is applied at the start of the next tick"
    assert not any(place in {"island", "moon"} for _, place, _ in moves)
    late = [prompt for tick, prompt, _, _ in records(dbs, "smith") if 20 <= tick < 23]
    assert late and all("- activity: drinking with friends" in p for p in late), "her routine takes over at its hour"


async def test_a_goal_set_by_the_game_is_in_every_later_prompt_until_replaced(tmp_path: Path) -> None:
    game: list[tuple[int, str, dict[str, object]]] = [
        (2, "goal", {"npc": "keeper", "goal": "Sell the last barrel of cider."}),
        (4, "goal", {"npc": "nobody", "goal": "Anything."}),
        (7, "goal", {"npc": "keeper", "goal": "Find the thief of the cider."}),
        (11, "goal", {"npc": "keeper", "goal": None}),
    ]
    broker, dbs = await walk(tmp_path, game=game)
    with open_reader(dbs[0]) as reader:
        taken = [(tick, i.goal) for tick, i in reader.all_inputs() if isinstance(i, Goal)]
    assert [goal for _, goal in taken] == [g[2]["goal"] for g in game if g[2]["npc"] == "keeper"]
    keeper = records(dbs, "keeper")
    spans = list(zip([t for t, _ in taken], [t for t, _ in taken[1:]] + [10**6], strict=True))
    assert all(any(a <= r[0] < b for r in keeper) for a, b in spans), ([r[0] for r in keeper], taken)
    for tick, prompt, _, _ in keeper:
        facts = prompt.partition("## Canonical facts\n")[2].partition("\n\n")[0]
        in_force = [goal for at, goal in taken if at <= tick]
        goal = in_force[-1] if in_force else None
        shown = [line for line in facts.splitlines() if "Your current goal" in line]
        assert shown == ([] if goal is None else [f"- Your current goal: {goal}"]), (tick, taken, prompt)
    errors = [json.loads(p) for t, p in broker.published if t == topics.game_error(RUN)]
    assert [e["code"] for e in errors] == ["unknown_npc"] and "nobody" in errors[0]["message"]


async def test_the_game_moves_an_npc_and_a_bad_move_is_refused(tmp_path: Path) -> None:
    game = [(3, "move", {"npc": "keeper", "location": "square"}),
            (5, "move", {"npc": "keeper", "location": "moon"}),
            (6, "move", {"npc": "ghost", "location": "inn"})]
    broker, dbs = await walk(tmp_path, game=game)
    with open_reader(dbs[0]) as reader:
        [(taken, move)] = [(tick, i) for tick, i in reader.all_inputs() if isinstance(i, Move)]
    assert (move.npc, move.location) == ("keeper", "square")
    assert moves_of(broker, "keeper") == [(taken, "square", "")], "moved at the tick that took the move"
    errors = [json.loads(p)["code"] for t, p in broker.published if t == topics.game_error(RUN)]
    assert errors == ["unknown_location", "unknown_npc"]
    late = [prompt for tick, prompt, _, _ in records(dbs, "keeper") if tick >= taken]
    assert late and all("- location: square" in p for p in late)


@pytest.mark.parametrize("shards", [2, 3])
async def test_the_town_walking_between_shards_gives_the_same_audit(tmp_path: Path, shards: int) -> None:
    town = Path(__file__).parent.parent / "scenarios" / "town-day.toml"
    scenario = load_scenario(town)
    owner = assign_places(scenario, shards)
    crossing = {spec.id for spec in scenario.npcs for entry in spec.schedule
                if owner[entry.location] != owner[spec.location]}
    assert crossing, "nobody walks to another shard's place: the test would test nothing"
    text = town.read_text()
    for where in ("one", "many"):
        (tmp_path / where).mkdir()
    _, one = await walk(tmp_path / "one", text, name="town")
    broker, many = await walk(tmp_path / "many", text, shards=shards, name="town")
    expected = {(t, p, line) for t, p, line, _ in records(one)}
    got = {(t, p, line) for t, p, line, _ in records(many)}
    assert len(expected) > 20
    assert got == expected, f"{len(expected - got)} records missing, {len(got - expected)} different"
    moved = {topic.split("/")[-2] for topic, _ in broker.published if topic.endswith("/location")}
    assert crossing & moved, "no NPC walked to another shard's place"


def test_a_schedule_needs_a_known_place() -> None:
    bad = WORLD.replace('location = "inn", activity = "drinking', 'location = "pub", activity = "drinking')
    with pytest.raises(Exception, match="unknown place 'pub'"):
        parse_scenario(bad, source="walk.toml")


async def test_a_stored_run_shows_each_npc_where_the_run_had_it(tmp_path: Path) -> None:
    """The view of a finished run (its store and scenario) puts every NPC where the live run's
    location messages put it, at every tick: routines, a go_to and a game's move alike."""
    game: list[tuple[int, str, dict[str, object]]] = [(3, "move", {"npc": "keeper", "location": "square"})]
    broker, dbs = await walk(tmp_path, game=game)
    scenario = parse_scenario(WORLD, source="walk.toml")
    stored = StoredRun(dbs[0], scenario)
    where = {spec.id: spec.location for spec in scenario.npcs}
    published = sorted((m.tick, m.agent, m.location) for topic, payload in broker.published
                       if topic.endswith("/location") for m in [decode_location(payload)])
    assert any(agent == "keeper" for _, agent, _ in published) and any(a == "smith" for _, a, _ in published)
    for tick in range(stored.first_tick, stored.last_tick + 1):
        for at, agent, place in published:
            if at == tick:
                where[agent] = place
        shown = {npc: place["id"] for place in stored.model(tick).world_view()["locations"] for npc in place["npcs"]}
        assert shown == where, f"tick {tick}"


async def test_a_stored_run_shows_where_the_routines_put_npcs_at_its_first_tick(tmp_path: Path) -> None:
    """An NPC whose routine has it away from home at the run's first hour stands there from tick 0."""
    night = WORLD.replace('schedule = [\n  { hour = 8,', 'schedule = [\n  { hour = 0, location = "inn", '
                          'activity = "sleeping off the ale", until = 6 },\n  { hour = 8,', 1)
    broker, dbs = await walk(tmp_path, night)
    assert moves_of(broker, "smith")[0] == (0, "inn", "sleeping off the ale")
    stored = StoredRun(dbs[0], parse_scenario(night, source="walk.toml"))
    shown = {npc: place["id"] for place in stored.model(stored.first_tick).world_view()["locations"]
             for npc in place["npcs"]}
    assert shown["smith"] == "inn"

