"""How many stored values are NaN or ±inf, in one compiled pass over their bit patterns.

A value of a binary float format is NaN or ±inf exactly when its exponent bits are all ones: bfloat16
(``uint16`` bit patterns in the store) ``0x7F80``, float16 ``0x7C00``, float32 ``0x7F800000``. Counting those
patterns is one read of the block with no temporary (numpy's ``(block & mask) == mask`` wrote two arrays
the size of the block and read them back: ~0.6 s per 16k x 2048 bfloat16 shard here, the largest part of an
import). :func:`lens.store.format.count_nonfinite_stored` calls it for every block a capture, merge or
import writes and a study reads.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_EXPONENT = {np.dtype(np.uint16): {"bfloat16": 0x7F80}, np.dtype(np.float16): {"float16": 0x7C00},
             np.dtype(np.float32): {"float32": 0x7F800000}}
_BITS = {2: np.uint16, 4: np.uint32}


@njit(cache=True, nogil=True)
def _count_all_ones(bits, mask):  # pragma: no cover - compiled
    c = 0
    for i in range(bits.size):
        if (bits[i] & mask) == mask:
            c += 1
    return c


def count_stored(block: np.ndarray, dtype: str) -> int | None:
    """NaN and ±inf values of ``block`` (the storage array of ``dtype``); None for a dtype or array this does
    not know (the caller's numpy path counts those)."""
    block = np.asarray(block)
    mask = _EXPONENT.get(block.dtype, {}).get(dtype)
    if mask is None:
        return None
    bits_type = _BITS[block.dtype.itemsize]
    bits = np.ascontiguousarray(block).reshape(-1).view(bits_type)
    return int(_count_all_ones(bits, bits_type(mask)))


__all__ = ["count_stored"]
