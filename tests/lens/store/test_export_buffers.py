"""lens.store.exchange.selection.BufferPool: an array given back is handed out again for the same shape and dtype
(the safetensors export reuses its blocks' arrays once their file is written and read back), never for another."""

from __future__ import annotations

import numpy as np

from lens.store.exchange.selection import BufferPool


def test_given_back_arrays_are_reused_by_shape_and_dtype():
    pool = BufferPool()
    a = pool.take((4, 3), np.uint16)
    b = pool.take((4, 3), np.uint16)
    assert a is not b and a.shape == (4, 3) and a.dtype == np.uint16
    pool.give([a])
    assert pool.take((4, 3), np.float16) is not a  # same bytes, other dtype: a fresh array
    assert pool.take((3, 4), np.uint16) is not a
    assert pool.take((4, 3), np.uint16) is a
    assert pool.take((4, 3), np.uint16) is not a  # handed out once
