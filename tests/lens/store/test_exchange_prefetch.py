"""``prefetched``: the exports read the next block in a thread while this one is written — the same items in
the same order, an error in the thread raised in the caller, and a caller that stops early stops the thread."""

from __future__ import annotations

import threading

import pytest

from lens.errors import StoreCorruptError
from lens.store.exchange.selection import prefetched


def test_same_items_in_order_and_bounded():
    made = []

    def items():
        for i in range(50):
            made.append(i)
            yield i

    for got in prefetched(items()):
        assert len(made) <= got + 3  # at most the queue's one and the one in the thread's hand ahead
    assert made == list(range(50))


def test_an_error_in_the_thread_is_raised_here_after_the_items_before_it():
    def items():
        yield 1
        raise StoreCorruptError("layer block 3 fails its checksum")

    got = []
    with pytest.raises(StoreCorruptError, match="fails its checksum"):
        for x in prefetched(items()):
            got.append(x)
    assert got == [1]


def test_stopping_early_stops_the_thread():
    before = threading.active_count()
    for x in prefetched(iter(range(10 ** 6))):
        if x == 3:
            break
    assert threading.active_count() == before
