"""Outside input journaled with the tick that takes it (sim.protocol.outside.OutsideJournal),
without a broker or a store: events in, the arrivals to journal out."""

from __future__ import annotations

import msgspec

from sim.protocol.outside import OutsideInput, OutsideJournal, PlayerArrival, WorldArrival
from sim.protocol.received import PlayerInputReceived, WorldStateReceived
from sim.wire.events import PlayerInputMessage, WorldStateMessage


def said(to: str, text: str = "hello", player: str = "p") -> PlayerInputReceived:
    return PlayerInputReceived(player, PlayerInputMessage(to=to, text=text))


def world(retained: bool = False, **state: str) -> WorldStateReceived:
    return WorldStateReceived(WorldStateMessage(state=state), retained=retained)


def test_player_input_is_stamped_with_the_open_tick_until_that_tick_takes_it() -> None:
    journal = OutsideJournal({"innkeeper"}, takes_world=True, tick=4)
    assert journal.stamp(said("innkeeper")) == PlayerArrival(tick=4, player="p", to="innkeeper", text="hello")
    journal.inputs_taken(4)
    assert journal.stamp(said("innkeeper", "later")) == PlayerArrival(tick=5, player="p", to="innkeeper",
                                                                        text="later")


def test_world_state_moves_on_with_the_tickdone_not_with_the_inputs() -> None:
    journal = OutsideJournal({"innkeeper"}, takes_world=True, tick=4)
    journal.inputs_taken(4)  # the tick's inputs are taken; its TickDone still takes world state
    assert journal.stamp(world(king="dead")) == WorldArrival(tick=4, state={"king": "dead"})
    journal.world_taken(4)
    assert journal.stamp(world(king="alive")) == WorldArrival(tick=5, state={"king": "alive"})


def test_what_this_shard_does_not_take_is_not_journaled() -> None:
    journal = OutsideJournal({"innkeeper"}, takes_world=False, tick=0)
    assert journal.stamp(said("smith")) is None  # another shard's NPC
    assert journal.stamp(world(king="dead")) is None  # shard 0 takes world state
    assert OutsideJournal({"innkeeper"}, takes_world=True, tick=0).stamp(world(True, king="dead")) is None


def test_an_outside_input_is_a_named_value_that_orders_by_seq() -> None:
    inputs = [OutsideInput(seq=2, player="a", to="x", text="b"), OutsideInput(seq=0, player="z", to="y", text="a")]
    assert [i.seq for i in sorted(inputs)] == [0, 2]
    raw = msgspec.msgpack.encode(inputs[0])
    assert msgspec.msgpack.decode(raw, type=OutsideInput) == inputs[0]
