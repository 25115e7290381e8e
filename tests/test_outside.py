"""Outside input journaled with the tick that takes it (sim.protocol.outside.OutsideJournal),
without a broker or a store: events in, the arrivals to journal out."""

from __future__ import annotations

import msgspec

from sim.protocol.outside import InputArrival, OutsideJournal, RunWideArrival, WorldArrival
from sim.protocol.received import OutsideReceived
from sim.wire.events import (
    GameEventMessage,
    GameFactMessage,
    PlayerInputMessage,
    PresenceMessage,
    WorldStateMessage,
)
from sim.wire.inputs import GameEvent, GameFact, OutsideInput, Presence, Taken


def said(to: str, text: str = "hello", player: str = "p", input_id: str | None = None) -> OutsideReceived:
    return OutsideReceived("player-input", player, PlayerInputMessage(to=to, text=text, id=input_id))


def world(retained: bool = False, **state: str) -> OutsideReceived:
    return OutsideReceived("world-state", "", WorldStateMessage(state=state), retained=retained)


def fact_for(fact_id: str, npc: str | None) -> OutsideReceived:
    return OutsideReceived("game-fact", "", GameFactMessage(id=fact_id, text="x", npc=npc))


def present_at(location: str) -> OutsideReceived:
    return OutsideReceived("presence", "alice", PresenceMessage(location=location))


def journal_of(*, shard_zero: bool = True, tick: int = 0) -> OutsideJournal:
    """Shard with NPC innkeeper at the inn; the run also has the forge (another shard's)."""
    return OutsideJournal({"innkeeper"}, {"inn"}, {"inn", "forge"}, shard_zero=shard_zero, tick=tick)


def test_player_input_is_stamped_with_the_open_tick_until_that_tick_takes_it() -> None:
    journal = journal_of(tick=4)
    assert journal.stamp(said("innkeeper", input_id="q1")) == InputArrival(
        tick=4, input=OutsideInput(player="p", to="innkeeper", text="hello", id="q1"))
    journal.inputs_taken(4)
    assert journal.stamp(said("innkeeper", "later")) == InputArrival(
        tick=5, input=OutsideInput(player="p", to="innkeeper", text="later"))


def test_world_state_moves_on_with_the_tickdone_not_with_the_inputs() -> None:
    journal = journal_of(tick=4)
    journal.inputs_taken(4)  # the tick's inputs are taken; its TickDone still takes world state
    assert journal.stamp(world(king="dead")) == WorldArrival(tick=4, state={"king": "dead"})
    journal.done_taken(4)
    assert journal.stamp(world(king="alive")) == WorldArrival(tick=5, state={"king": "alive"})


def test_an_event_and_a_fact_for_one_npc_are_stamped_like_player_input() -> None:
    journal = journal_of(tick=2)
    event = OutsideReceived("game-event", "", GameEventMessage(location="inn", text="A fire", significance=0.8))
    fact = OutsideReceived("game-fact", "", GameFactMessage(npc="innkeeper", id="cellar", text="The cellar flooded"))
    assert [journal.stamp(e) for e in (event, fact)] == [
        InputArrival(tick=2, input=GameEvent(location="inn", text="A fire", significance=0.8)),
        InputArrival(tick=2, input=GameFact(npc="innkeeper", id="cellar", text="The cellar flooded")),
    ]


def test_presence_and_a_fact_for_every_npc_move_on_with_shard_zeros_tickdone() -> None:
    journal = journal_of(tick=2)
    fact = OutsideReceived("game-fact", "", GameFactMessage(id="war", text="War broke out"))
    presence = OutsideReceived("presence", "alice", PresenceMessage(location="forge"))
    journal.inputs_taken(2)  # tick 2 took its inputs; its TickDone still takes what every shard applies
    assert [journal.stamp(e) for e in (fact, presence)] == [
        RunWideArrival(tick=2, input=GameFact(npc=None, id="war", text="War broke out")),
        RunWideArrival(tick=2, input=Presence(player="alice", location="forge")),
    ]
    journal.done_taken(2)
    assert journal.stamp(presence) == RunWideArrival(tick=3, input=Presence(player="alice", location="forge"))


def test_what_this_shard_does_not_take_is_not_journaled() -> None:
    journal = journal_of(shard_zero=False)
    assert journal.stamp(said("smith")) is None  # another shard's NPC
    assert journal.stamp(world(king="dead")) is None  # shard 0 takes world state
    assert journal.stamp(fact_for("war", None)) is None  # and facts for every NPC
    assert journal.stamp(present_at("inn")) is None  # and presence
    assert journal_of().stamp(world(True, king="dead")) is None
    assert journal.stamp(OutsideReceived("game-event", "", GameEventMessage(location="forge", text="x"))) is None
    assert journal.stamp(fact_for("f", "smith")) is None
    assert journal_of().stamp(present_at("moon")) is None  # no such place


def test_an_outside_input_is_a_named_value_that_orders_by_seq() -> None:
    inputs = [OutsideInput(seq=2, player="a", to="x", text="b"), OutsideInput(seq=0, player="z", to="y", text="a")]
    assert [i.seq for i in sorted(inputs)] == [0, 2]
    raw = msgspec.msgpack.encode(inputs[0])
    assert msgspec.msgpack.decode(raw, type=OutsideInput) == inputs[0]
    taken: list[Taken] = [*inputs, Presence(seq=3, player="a", location=None)]
    assert msgspec.json.decode(msgspec.json.encode(taken), type=list[Taken]) == taken
