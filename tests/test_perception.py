"""Shared perception against the rule it replaces: one episode per listener per event heard.

The simple rule gives every NPC at a place its own copy of every event said
there (but its own lines), and its state held the newest `hot_limit` of all it had. Now a
place keeps one log, trimmed by the window rule, and a listener's episodic memory is
merged from it when needed. A small reference model of the old rule checks, over random
event sequences, that nothing differs: the window never drops what a listener's newest
`hot_limit` needs, and the merged memory is exactly the old one.
"""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.npc import NpcAgent
from sim.memory import Episode, episode_order
from sim.shard._perception import Perception
from sim.shard._window import PlaceWindow
from sim.wire.events import AnyEvent, Notice, Speech

LISTENERS = ("a", "b", "c", "d")
SPEAKERS = (*LISTENERS, "player", "(notice)")


def random_ticks(seed: int, ticks: int, *, talkative: str | None = None) -> list[list[AnyEvent]]:
    """Each tick's events at one place, sorted by (tick, id), as the shard appends them."""
    rng = random.Random(seed)
    out = []
    for tick in range(ticks):
        events: list[AnyEvent] = []
        for n in range(rng.randrange(0, 6)):
            speaker = talkative if talkative and rng.random() < 0.7 else rng.choice(SPEAKERS)
            if speaker == "(notice)":
                events.append(Notice(id=f"r:gm:{tick}:{n}", tick=tick, text=f"bell {tick}.{n}",
                                     significance=rng.choice((0.1, 0.5, 1.0))))
                continue
            to = rng.choice((*LISTENERS, None, "elsewhere"))
            events.append(Speech(id=f"r:{speaker}:{tick}:{n}", tick=tick, speaker=speaker, to=to,
                                 text=f"line {tick}.{n} by {speaker}", from_player=speaker == "player",
                                 location="square"))
        out.append(sorted(events, key=lambda e: (e.tick, e.id)))
    return out


def old_rule(listener: str, history: list[AnyEvent], private: list[Episode], limit: int) -> tuple[Episode, ...]:
    """The simple rule: one episode per event heard (its own lines skipped), with
    the private ones; the newest `limit` in recency order."""
    heard = [NpcAgent.episode_of(e, isinstance(e, Speech) and e.to == listener) for e in history
             if not (isinstance(e, Speech) and e.speaker == listener)]
    return tuple(sorted([*private, *heard], key=episode_order)[-limit:])


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), ticks=st.integers(1, 60), limit=st.integers(1, 12),
       talkative=st.sampled_from([None, "a", "player"]))
def test_the_window_never_drops_what_a_listeners_newest_need(seed: int, ticks: int, limit: int,
                                                              talkative: str | None) -> None:
    window = PlaceWindow(LISTENERS, limit)
    history: list[AnyEvent] = []
    for events in random_ticks(seed, ticks, talkative=talkative):
        window.append(events)
        history += events
        for listener in LISTENERS:
            not_mine = [e for e in history if not (isinstance(e, Speech) and e.speaker == listener)]
            newest = [entry.event for entry in itertools.islice(window.not_spoken_by(listener), limit)]
            assert newest[::-1] == not_mine[-limit:]
        # and it is bounded: a speaker who is not a listener never holds the window open
        counts = [sum(1 for e in window if e.speaker == who) for who in LISTENERS]
        assert len(window) <= limit + 1 + max(counts) or len(window) == len(history)


def test_a_place_where_one_npc_talks_keeps_only_what_the_others_need() -> None:
    window = PlaceWindow(LISTENERS, 5)
    for tick in range(50):
        window.append([Speech(id=f"r:a:{tick}:1", tick=tick, speaker="a", text="again", location="square")])
    assert len(window) == 5 and window.front_tick == 45


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), ticks=st.integers(1, 50), limit=st.integers(1, 10),
       privates=st.integers(0, 15))
def test_shared_perception_gives_the_state_the_old_one_did(seed: int, ticks: int, limit: int, privates: int) -> None:
    rng = random.Random(seed)
    perception = Perception({"square": LISTENERS}, limit=limit, window=limit + rng.randrange(0, 3))
    private = {who: sorted((Episode(id=f"e{who}{n}", tick=rng.randrange(0, ticks + 1), text=f"mine {n}",
                                    significance=0.5) for n in range(rng.randrange(0, privates + 1))),
                           key=episode_order)[-limit:] for who in LISTENERS}
    history: list[AnyEvent] = []
    for events in random_ticks(seed, ticks):
        perception.append("square", events)
        history += events
        for listener in LISTENERS:
            got = perception.episodic(listener, "square", tuple(private[listener]), NpcAgent.episode_of)
            assert got == old_rule(listener, history, private[listener], limit)
        # mail is what was said to a listener there, by someone else
        for listener in LISTENERS:
            said_to = [e for e in events if isinstance(e, Speech) and e.to == listener and e.speaker != listener]
            assert perception.take_mail(listener) == said_to


def test_everyone_who_overheard_an_event_shares_one_memory_of_it() -> None:
    perception = Perception({"square": LISTENERS}, limit=8, window=8)
    said = Speech(id="r:player:0:0", tick=0, speaker="player", to="a", text="Hello, a.", from_player=True)
    perception.append("square", [said])
    b, c = (perception.episodic(who, "square", (), NpcAgent.episode_of)[0] for who in ("b", "c"))
    a = perception.episodic("a", "square", (), NpcAgent.episode_of)[0]
    assert b is c and b.text == 'player said to a: "Hello, a."' and b.significance == 0.3
    assert a.text == 'player said to me: "Hello, a."' and a.significance == 0.9
