"""A scenario's day: the clock, routines by the hour, schedules and exits checked in one line,
the bundled town and the generated world with a day."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.day import PlaceMap, Routine, ScheduleEntry, check_schedule, clock_text, day_of, hour_of
from sim.errors import ScenarioError
from sim.generate import generate_scenario
from sim.scenario import load_scenario, parse_scenario
from sim.shard._place_shares import assign_places
from tests.helpers import REPO, npcsim_in_process, run_npcsim

pytestmark = pytest.mark.timeout(60)

PLACES = ("home", "forge", "inn")
TOWN = REPO / "scenarios" / "town-day.toml"


def covering(entries: list[ScheduleEntry], hour: int) -> list[ScheduleEntry]:
    """The entries that cover `hour`, read straight from the coverage rule."""
    starts = sorted({e.hour for e in entries})
    found = []
    for e in entries:
        end = e.until if e.until is not None else next((s for s in starts if s > e.hour), starts[0] + 24)
        if (hour - e.hour) % 24 < end - e.hour:
            found.append(e)
    return found


@st.composite
def in_range_entries(draw: st.DrawFn) -> ScheduleEntry:
    hour = draw(st.integers(0, 23))
    until = draw(st.none() | st.integers(hour + 1, 24))
    return ScheduleEntry(hour=hour, location=draw(st.sampled_from(PLACES)), until=until)


@st.composite
def good_schedules(draw: st.DrawFn) -> list[ScheduleEntry]:
    """Schedules valid by construction: distinct starts, each `until` at most the next start."""
    starts = sorted(draw(st.sets(st.integers(0, 23), min_size=1, max_size=8)))
    entries = []
    for hour, after in zip(starts, [*starts[1:], 24], strict=True):
        until = draw(st.none() | st.integers(hour + 1, after))
        entries.append(ScheduleEntry(hour=hour, location=draw(st.sampled_from(PLACES)), until=until))
    return draw(st.permutations(entries))


@given(st.lists(in_range_entries(), min_size=1, max_size=6))
def test_a_schedule_is_refused_exactly_when_two_entries_cover_an_hour(entries: list[ScheduleEntry]) -> None:
    overlapping = any(len(covering(entries, hour)) > 1 for hour in range(24))
    problem = check_schedule(entries, PLACES)
    assert (problem is not None) == overlapping, problem
    assert problem is None or ("overlap" in problem and "\n" not in problem)


@given(good_schedules())
def test_a_routine_reads_each_hour_as_the_coverage_rule(entries: list[ScheduleEntry]) -> None:
    assert check_schedule(entries, PLACES) is None
    routine = Routine(entries)
    assert routine
    for hour in range(24):
        covered = covering(entries, hour)
        assert len(covered) <= 1
        assert routine.at(hour) == (covered[0] if covered else None)


def test_routine_examples() -> None:
    work = ScheduleEntry(hour=8, location="forge", activity="working")
    rest = ScheduleEntry(hour=18, location="home", activity="resting")
    routine = Routine([rest, work])
    assert [routine.at(h) for h in (0, 7, 8, 17, 18, 23)] == [rest, rest, work, work, rest, rest]
    alone = Routine([ScheduleEntry(hour=5, location="inn")])
    assert all(alone.at(h) is not None for h in range(24))
    gaps = Routine([ScheduleEntry(hour=9, location="inn", until=12)])
    assert [gaps.at(h) is not None for h in (8, 9, 11, 12)] == [False, True, True, False]
    assert not Routine([]) and Routine([]).at(3) is None


@pytest.mark.parametrize(("entries", "named"), [
    ([ScheduleEntry(hour=8, location="moon")], "unknown place 'moon'"),
    ([ScheduleEntry(hour=24, location="inn")], "hour 24"),
    ([ScheduleEntry(hour=-1, location="inn")], "hour -1"),
    ([ScheduleEntry(hour=8, location="inn", until=8)], "until 8"),
    ([ScheduleEntry(hour=8, location="inn", until=25)], "until 25"),
    ([ScheduleEntry(hour=8, location="inn"), ScheduleEntry(hour=8, location="forge")], "hour 8 and hour 8"),
    ([ScheduleEntry(hour=8, location="inn", until=12), ScheduleEntry(hour=10, location="forge")],
     "hour 8 and hour 10"),
])
def test_check_schedule_names_the_first_problem(entries: list[ScheduleEntry], named: str) -> None:
    problem = check_schedule(entries, PLACES)
    assert problem is not None and named in problem and "\n" not in problem


@pytest.mark.parametrize(("tick", "tpd", "hour", "day", "text"), [
    (0, 24, 0, 1, "day 1, 00:00"),
    (8, 24, 8, 1, "day 1, 08:00"),
    (23, 24, 23, 1, "day 1, 23:00"),
    (24, 24, 0, 2, "day 2, 00:00"),
    (50, 24, 2, 3, "day 3, 02:00"),
    (1, 48, 0, 1, "day 1, 00:30"),
    (47, 48, 23, 1, "day 1, 23:30"),
    (7, 10, 16, 1, "day 1, 16:48"),
    (5, 1, 0, 6, "day 6, 00:00"),
    (1000, 1440, 16, 1, "day 1, 16:40"),
])
def test_the_clock_of_a_tick(tick: int, tpd: int, hour: int, day: int, text: str) -> None:
    assert (hour_of(tick, tpd), day_of(tick, tpd), clock_text(tick, tpd)) == (hour, day, text)


EXITS = st.dictionaries(st.sampled_from("abcdefg"), st.lists(st.sampled_from("abcdefg"), max_size=3), min_size=1)


@given(EXITS, st.sampled_from("abcdefgh"), st.sampled_from("abcdefgh"))
def test_reachable_is_symmetric(exits: dict[str, list[str]], start: str, goal: str) -> None:
    places = PlaceMap(exits)
    assert places.reachable(start, goal) == places.reachable(goal, start)
    assert places.reachable(start, start)


@given(st.lists(st.sampled_from("abcdefg"), min_size=1), st.sampled_from("abcdefgh"), st.sampled_from("abcdefgh"))
def test_without_exits_every_place_reaches_every_other(places: list[str], start: str, goal: str) -> None:
    assert PlaceMap({place: [] for place in places}).reachable(start, goal)


def test_reachable_follows_exits_both_ways() -> None:
    places = PlaceMap({"square": ["forge", "market"], "market": ["mill"], "forge": [], "mill": [], "moor": [],
                       "cave": ["moor"]})
    assert places.reachable("forge", "mill") and places.reachable("mill", "square")
    assert places.reachable("moor", "cave")
    assert not places.reachable("forge", "moor") and not places.reachable("cave", "square")
    assert not places.reachable("forge", "nowhere")


DAY = Path(TOWN).read_text()
SMITH = 'schedule = [\n  { hour = 6, location = "forge", activity = "working the bellows", until = 18 },'
BAD = {
    "a schedule needs `ticks_per_day`": DAY.replace("ticks_per_day = 24 ", "", 1),
    "unknown place 'moon'": DAY.replace(SMITH, SMITH.replace('"forge"', '"moon"'), 1),
    "hour 25 is not in 0..23": DAY.replace(SMITH, SMITH.replace("hour = 6", "hour = 25"), 1),
    "until 18 (hour 19)": DAY.replace(SMITH, SMITH.replace("hour = 6", "hour = 19"), 1),
    "the entries at hour 6 and hour 18 overlap": DAY.replace(SMITH, SMITH.replace("until = 18", "until = 19"), 1),
}


@pytest.mark.parametrize("named", sorted(BAD))
def test_a_bad_schedule_is_one_line_naming_the_file_and_the_npc(named: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(BAD[named], source="town.toml")
    message = str(caught.value)
    assert message.startswith("town.toml: npc 'blacksmith' (npcs[0]), field schedule: "), message
    assert named in message and "\n" not in message


def test_an_exit_to_an_unknown_place_is_one_line() -> None:
    broken = DAY.replace('exits = ["mill"]', 'exits = ["mill", "moon"]', 1)
    with pytest.raises(ScenarioError, match=r"^town.toml: location 'market', field exits: unknown location 'moon'$"):
        parse_scenario(broken, source="town.toml")


def test_new_fields_keep_their_bounds_and_unknown_fields_stay_refused() -> None:
    with pytest.raises(ScenarioError, match=r"ticks_per_day"):
        parse_scenario(DAY.replace("ticks_per_day = 24 ", "ticks_per_day = 0 ", 1), source="town.toml")
    with pytest.raises(ScenarioError, match=r"npc 'blacksmith' \(npcs\[0\]\), field goal"):
        parse_scenario(DAY.replace('goal = "Finish', f'goal = "{"x" * 500}', 1), source="town.toml")
    with pytest.raises(ScenarioError, match=r"field schedule\[0\].*unknown field `hours`.*did you mean `hour`"):
        parse_scenario(DAY.replace(SMITH, SMITH.replace("hour = 6", "hours = 6"), 1), source="town.toml")


@pytest.mark.parametrize("named", sorted(BAD))
def test_the_run_refuses_a_bad_schedule_in_one_line(named: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(BAD[named])
    ran = npcsim_in_process(capsys, "run", str(path), "--ticks", "2", "--quiet")
    assert ran.code == 2 and ran.out == ""
    assert ran.err.count("\n") == 1 and named in ran.err and "Traceback" not in ran.err, ran.err


def test_the_npcsim_command_refuses_a_bad_schedule_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(BAD["the entries at hour 6 and hour 18 overlap"])
    ran = run_npcsim("run", str(path), "--ticks", "2", "--quiet", within=60)
    assert ran.code != 0 and ran.out == ""
    assert ran.err.count("\n") == 1 and "bad.toml: npc 'blacksmith'" in ran.err and "Traceback" not in ran.err


def test_the_town_lives_through_its_days() -> None:
    town = load_scenario("town-day")
    assert town.scenario.ticks_per_day == 24 and town.scenario.ticks == 48
    places = {loc.id for loc in town.locations}
    assert len(places) == 8 and len(town.npcs) == 8
    assert all(npc.schedule for npc in town.npcs) and sum(bool(npc.goal) for npc in town.npcs) >= 6
    assert sum("go_to" in npc.intents for npc in town.npcs) == 2
    routines = {npc.id: Routine(npc.schedule) for npc in town.npcs}
    evening = routines["blacksmith"].at(19)
    assert evening is not None and evening.location == "inn"
    assert routines["blacksmith"].at(2) is None  # at home
    maps = town.place_map
    assert all(maps.reachable("square", place) for place in places)
    assert not PlaceMap({loc.id: [e for e in loc.exits if e != "square"] for loc in town.locations
                         if loc.id != "square"}).reachable("forge", "mill")  # only through the square
    shards = assign_places(town, 3)
    assert Counter(shards[npc.location] for npc in town.npcs).keys() == {0, 1, 2}


def test_a_scenario_without_a_day_has_no_clock_and_open_places() -> None:
    village = load_scenario("village")
    assert village.scenario.ticks_per_day is None
    assert all(not npc.schedule and not npc.goal for npc in village.npcs)
    assert village.place_map.reachable("forge", "inn")


def test_a_generated_world_with_a_day_gives_every_npc_a_schedule() -> None:
    plain = generate_scenario(npcs=200, locations=7, seed=5)
    assert plain == generate_scenario(npcs=200, locations=7, seed=5, day=False) and "schedule" not in plain
    text = generate_scenario(npcs=200, locations=7, seed=5, day=True)
    assert text == generate_scenario(npcs=200, locations=7, seed=5, day=True)
    world = parse_scenario(text)
    assert world.scenario.ticks_per_day == 24
    away = 0
    for npc in world.npcs:
        routine = Routine(npc.schedule)
        home, work = routine.at(3), routine.at(12)
        assert home is not None and work is not None
        assert home.location == npc.location and routine.at(20) == home and routine.at(8) == work
        away += work.location != npc.location
    assert 60 <= away <= 140  # about half work away from home
    one = parse_scenario(generate_scenario(npcs=10, locations=1, day=True))
    assert all(npc.schedule[0].location == "l0" for npc in one.npcs)


def test_scenario_generate_day(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "day.toml"
    ran = npcsim_in_process(capsys, "scenario", "generate", "--npcs", "30", "--locations", "4", "--day",
                            "--out", str(out))
    assert ran.code == 0, ran.err
    world = load_scenario(out)
    assert world.scenario.ticks_per_day == 24 and all(npc.schedule for npc in world.npcs)
