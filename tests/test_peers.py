"""A shard's side of the barrier's handshake (sim.protocol.admission.Peers), without a broker:
barrier messages of the other shards in, decisions out."""

from __future__ import annotations

from sim.protocol.admission import Peers, Refused
from sim.protocol.barrier import Barrier
from sim.wire.barrier import Hello, Join, Welcome

NONCE = bytes.fromhex("00ff" * 8)


def peers(shard: str = "0", *, trusted: bool = False) -> Peers:
    barrier = Barrier(shard, ["0", "1", "2"], lambda _topic: True, trusted=trusted)
    return Peers(barrier, answers_hello=shard == "0", interval=1.0)


def join(shard: str = "1", *, tick: int = 0, session: str = "s1", seq: int = 0, shards: int = 3) -> Join:
    return Join(shard=shard, shards=shards, tick=tick, session=session, seq=seq)


def test_a_join_asks_for_one_resend_from_its_tick_and_a_replay_is_refused() -> None:
    p = peers()
    assert p.receive(join(tick=3), now=0.0) is None
    assert p.resend_from(0.0) == 3
    assert p.resend_from(0.1) is None  # served: nothing due until another Join
    refused = p.receive(join(tick=3), now=0.2)  # the same Join again
    assert isinstance(refused, Refused) and (refused.kind, refused.peer) == ("repeated barrier request", "1")
    assert p.resend_from(5.0) is None


def test_joins_within_the_interval_are_folded_into_one_resend_from_the_lowest_tick() -> None:
    p = peers()
    p.receive(join(tick=5, seq=0), now=0.0)
    assert p.resend_from(0.0) == 5
    for seq, tick in enumerate((7, 4, 6), start=1):
        assert p.receive(join(tick=tick, seq=seq), now=0.1 * seq) is None
    assert p.resend_from(0.5) is None  # the peer's interval is not over
    assert p.resend_from(1.0) == 4
    assert p.resends.resends == 2 and p.resends.folded == 3
    assert p.folded(1.0) == {"1": 3}
    assert p.folded(1.5) == {}


def test_our_own_join_and_one_of_another_run_are_not_served_nor_counted() -> None:
    p = peers()
    assert p.receive(join(shard="0"), now=0.0) is None
    assert p.resend_from(2.0) is None


def test_an_unauthenticated_join_with_another_shard_count_is_counted_not_served() -> None:
    p = peers()
    refused = p.receive(join(shards=4), now=0.0)
    assert refused is not None and refused.kind == "unauthenticated shard count conflict" and refused.peer == "1"
    assert p.resend_from(2.0) is None


def test_an_authenticated_join_with_another_shard_count_is_the_barriers_conflict() -> None:
    barrier = Barrier("0", ["0", "1", "2"], lambda _topic: True, trusted=True)
    p = Peers(barrier, answers_hello=True)
    assert p.receive(join(shards=4), now=0.0) is None
    assert barrier.conflict is not None and "every shard of a run needs the same count" in barrier.conflict


def test_shard_0_welcomes_each_hello_once_with_the_nonce() -> None:
    p = peers("0")
    hello = Hello(shard="2", shards=3, challenge="ab" * 8)
    assert p.receive(hello, now=0.0) is None
    assert p.receive(hello, now=0.1) is not None  # a replayed Hello
    assert p.welcomes(NONCE) == [Welcome(shard="0", shards=3, challenge="ab" * 8, nonce=NONCE.hex())]
    assert p.welcomes(NONCE) == []  # answered once


def test_without_a_run_key_there_is_no_nonce_to_welcome_with() -> None:
    p = peers("0")
    p.receive(Hello(shard="1", shards=3, challenge="cd" * 8), now=0.0)
    assert p.welcomes(None) == []


def test_another_shard_leaves_hellos_and_welcomes_to_shard_0() -> None:
    p = peers("1")
    assert p.receive(Hello(shard="2", shards=3, challenge="ab" * 8), now=0.0) is None
    assert p.receive(Welcome(shard="0", shards=3, challenge="ab" * 8, nonce=NONCE.hex()), now=0.0) is None
    assert p.welcomes(NONCE) == []


def test_hellos_of_one_peer_are_served_at_most_per_tick() -> None:
    p = peers("0")
    served = [p.receive(Hello(shard="1", shards=3, challenge=f"{n:016x}"), now=0.0) is None for n in range(6)]
    assert served == [True] * 4 + [False] * 2
    assert len(p.welcomes(NONCE)) == 4
