"""The pure parts of spreading requests over servers: rendezvous order and the AIMD limit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sim.inference.backends.spread import AdaptiveLimit, rendezvous_order

servers = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=8, unique=True)
keys = st.lists(st.text(max_size=12), min_size=1, max_size=40, unique=True)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@given(keys, servers)
def test_the_order_is_every_server_once_and_the_same_whatever_order_they_are_given_in(
    names: list[str], urls: list[str],
) -> None:
    for key in names:
        order = rendezvous_order(key, urls)
        assert sorted(order) == sorted(urls)
        assert rendezvous_order(key, list(reversed(urls))) == order


@given(keys, servers, st.text(min_size=1, max_size=12))
def test_a_server_added_takes_only_the_keys_that_rank_it_first(names: list[str], urls: list[str], new: str) -> None:
    if new in urls:
        return
    for key in names:
        before, after = rendezvous_order(key, urls), rendezvous_order(key, [*urls, new])
        assert [u for u in after if u != new] == before  # the others keep their order
        assert after[0] in (before[0], new)


@given(keys, servers, st.data())
def test_a_server_removed_moves_only_its_own_keys_each_to_its_next(
    names: list[str], urls: list[str], data: st.DataObject,
) -> None:
    gone = data.draw(st.sampled_from(urls))
    rest = [u for u in urls if u != gone]
    for key in names:
        before = rendezvous_order(key, urls)
        assert rendezvous_order(key, rest) == [u for u in before if u != gone]


def test_keys_spread_over_the_servers() -> None:
    urls = [f"http://10.0.0.{n}:8080/v1" for n in range(4)]
    firsts = [rendezvous_order(f"npc{n}", urls)[0] for n in range(400)]
    assert all(60 < firsts.count(url) < 140 for url in urls)


events = st.lists(st.tuples(st.sampled_from(["start", "answer", "overload"]), st.floats(0, 5),
                          st.none() | st.floats(0, 5)), max_size=200)


@given(st.integers(1, 200), events)
def test_the_limit_stays_within_one_and_the_ceiling(
    ceiling: int, steps: list[tuple[str, float, float | None]],
) -> None:
    clock = Clock()
    limit = AdaptiveLimit(ceiling, clock=clock)
    started: list[float] = []
    for kind, advance, served in steps:
        clock.now += advance
        if kind == "start" or not started:
            started.append(limit.start())
        elif kind == "answer":
            limit.answered(started.pop(0), served)
        else:
            limit.overloaded(started.pop(0))
        assert 1 <= limit.limit <= ceiling


def test_an_overload_seen_by_every_request_in_flight_cuts_once() -> None:
    clock = Clock()
    limit = AdaptiveLimit(64, decrease=0.5, clock=clock)
    started = [limit.start() for _ in range(64)]
    clock.now = 1.0
    for s in started:
        limit.overloaded(s)
    assert limit.limit == 32 and limit.decreases == 1
    clock.now = 2.0
    limit.overloaded(limit.start())  # a request sent after the cut
    assert limit.limit == 16


def answer_after(limit: AdaptiveLimit, clock: Clock, seconds: float, served: float | None) -> None:
    started = limit.start()
    clock.now += seconds
    limit.answered(started, served)


def test_answers_that_waited_as_long_as_they_were_served_cut_and_prompt_cost_alone_does_not() -> None:
    clock = Clock()
    limit = AdaptiveLimit(8, decrease=0.5, clock=clock)
    for served in (0.1, 2.0, 0.3, 5.0, 0.1):  # prompts that cost 50 times as much as others: no queue
        answer_after(limit, clock, served + 0.01, served)
    assert limit.limit == 8 and limit.decreases == 0
    answer_after(limit, clock, 0.5, 0.1)  # one answer that waited is not yet a queue
    assert limit.limit == 8
    for _ in range(10):
        answer_after(limit, clock, 0.5, 0.1)  # four fifths of each answer spent waiting: the server's queue
    assert limit.limit < 8
    for _ in range(60):
        answer_after(limit, clock, 0.1, 0.1)
    assert limit.limit == 8  # back at the ceiling, never over it


def test_a_server_that_does_not_say_its_own_time_is_cut_only_by_overloads() -> None:
    clock = Clock()
    limit = AdaptiveLimit(8, decrease=0.5, clock=clock)
    for seconds in (0.1, 5.0, 9.0, 20.0):
        answer_after(limit, clock, seconds, None)
    assert limit.limit == 8 and limit.decreases == 0
    limit.overloaded(limit.start())
    assert limit.limit == 4
