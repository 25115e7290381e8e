"""Outside input journaled with the tick that takes it (sim.protocol.outside.OutsideJournal),
without a broker or a store: events in, the arrivals to journal out."""

from __future__ import annotations

import msgspec

from sim.protocol.outside import (
    GameEvent,
    GameFact,
    InputArrival,
    OutsideInput,
    OutsideJournal,
    Presence,
    Taken,
    WorldArrival,
)
from sim.protocol.received import (
    GameEventReceived,
    GameFactReceived,
    PlayerInputReceived,
    PresenceReceived,
    WorldStateReceived,
)
from sim.wire.events import (
    GameEventMessage,
    GameFactMessage,
    PlayerInputMessage,
    PresenceMessage,
    WorldStateMessage,
)


def said(to: str, text: str = "hello", player: str = "p", input_id: str | None = None) -> PlayerInputReceived:
    return PlayerInputReceived(player, PlayerInputMessage(to=to, text=text, id=input_id))


def world(retained: bool = False, **state: str) -> WorldStateReceived:
    return WorldStateReceived(WorldStateMessage(state=state), retained=retained)


def journal_of(*, takes_world: bool = True, tick: int = 0) -> OutsideJournal:
    """Shard with NPC innkeeper at the inn; the run also has the forge (another shard's)."""
    return OutsideJournal({"innkeeper"}, {"inn"}, {"inn", "forge"}, takes_world=takes_world, tick=tick)


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
    journal.world_taken(4)
    assert journal.stamp(world(king="alive")) == WorldArrival(tick=5, state={"king": "alive"})


def test_the_game_systems_inputs_are_stamped_like_player_input() -> None:
    journal = journal_of(tick=2)
    event = GameEventReceived(GameEventMessage(location="inn", text="A fire", significance=0.8))
    fact = GameFactReceived(GameFactMessage(id="war", text="War broke out"))
    presence = PresenceReceived("alice", PresenceMessage(location="forge"))
    assert [journal.stamp(e) for e in (event, fact, presence)] == [
        InputArrival(tick=2, input=GameEvent(location="inn", text="A fire", significance=0.8)),
        InputArrival(tick=2, input=GameFact(npc=None, id="war", text="War broke out")),
        InputArrival(tick=2, input=Presence(player="alice", location="forge")),
    ]


def test_what_this_shard_does_not_take_is_not_journaled() -> None:
    journal = journal_of(takes_world=False)
    assert journal.stamp(said("smith")) is None  # another shard's NPC
    assert journal.stamp(world(king="dead")) is None  # shard 0 takes world state
    assert journal_of().stamp(world(True, king="dead")) is None
    assert journal.stamp(GameEventReceived(GameEventMessage(location="forge", text="x"))) is None  # another's place
    assert journal.stamp(GameFactReceived(GameFactMessage(npc="smith", id="f", text="x"))) is None
    assert journal.stamp(PresenceReceived("alice", PresenceMessage(location="moon"))) is None  # no such place


def test_an_outside_input_is_a_named_value_that_orders_by_seq() -> None:
    inputs = [OutsideInput(seq=2, player="a", to="x", text="b"), OutsideInput(seq=0, player="z", to="y", text="a")]
    assert [i.seq for i in sorted(inputs)] == [0, 2]
    raw = msgspec.msgpack.encode(inputs[0])
    assert msgspec.msgpack.decode(raw, type=OutsideInput) == inputs[0]
    taken: list[Taken] = [*inputs, Presence(seq=3, player="a", location=None)]
    assert msgspec.json.decode(msgspec.json.encode(taken), type=list[Taken]) == taken
