"""sim.protocol.batcher without I/O: the byte bound and the flush (count, linger and deadlines:
tests/test_inference_batch.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.protocol.batcher import Batcher


def test_a_batch_is_due_once_its_sizes_reach_the_byte_bound() -> None:
    b: Batcher[str] = Batcher(max_bytes=10, linger=5.0)
    b.add("a", size=4, now=0.0)
    assert b.fits(6) and not b.fits(7)
    b.add("b", size=4, now=0.0)
    assert not b.ready(0.0) and b.due() == 5.0
    b.add("c", size=2, now=1.0)
    assert b.ready(1.0) and b.take(1.0) == (["a", "b", "c"], [])


def test_an_item_over_the_bound_goes_alone_and_what_does_not_fit_stays_for_the_next() -> None:
    b: Batcher[str] = Batcher(max_bytes=10)
    assert b.fits(50)  # nothing waits: any item fits
    for name, size in [("a", 6), ("big", 50), ("b", 3), ("c", 3)]:
        b.add(name, size=size, now=0.0)
    assert b.take(0.0) == (["a"], [])
    assert b.take(0.0) == (["big"], [])
    assert b.ready(0.0) and b.take(0.0) == (["b", "c"], [])
    assert len(b) == 0 and b.due() is None


def test_take_is_a_flush_it_hands_over_a_batch_that_is_not_due() -> None:
    b: Batcher[str] = Batcher(max_items=8, max_bytes=100, linger=30.0)
    b.add("a", size=5, now=0.0)
    assert not b.ready(1.0) and b.take(1.0) == (["a"], [])


def test_bad_byte_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        Batcher(max_bytes=0)


@given(st.lists(st.integers(0, 30), max_size=60), st.integers(1, 40), st.integers(1, 6))
def test_every_item_leaves_once_in_order_within_both_bounds(sizes: list[int], max_bytes: int, max_items: int) -> None:
    b: Batcher[int] = Batcher(max_items=max_items, max_bytes=max_bytes, linger=1.0)
    out: list[int] = []
    for n, size in enumerate(sizes):
        b.add(n, size=size, now=float(n))
        if b.ready(float(n)):
            batch, _ = b.take(float(n))
            assert len(batch) <= max_items
            assert len(batch) == 1 or sum(sizes[i] for i in batch) <= max_bytes
            out += batch
    while len(b):
        out += b.take(1e9)[0]
    assert out == list(range(len(sizes)))
