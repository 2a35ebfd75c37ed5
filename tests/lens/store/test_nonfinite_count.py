"""lens.store.nonfinite.count_stored counts what numpy's isfinite does (bfloat16 bit patterns, float16, float32;
NaNs of every payload, ±inf, subnormals, the largest finite values, non-contiguous blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from lens.store.format import count_nonfinite_stored
from lens.store.nonfinite import count_stored


def _bf16_reference(bits):
    f = (bits.astype(np.uint32) << 16).view(np.float32)
    return int(np.count_nonzero(~np.isfinite(f)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_counts_equal_isfinite(dtype):
    rng = np.random.default_rng(len(dtype))
    if dtype == "bfloat16":
        x = rng.integers(0, 1 << 16, (300, 37), dtype=np.uint16)  # every bit pattern family, NaN payloads included
        want = _bf16_reference(x)
    else:
        width = np.uint16 if dtype == "float16" else np.uint32
        x = rng.integers(0, np.iinfo(width).max, (300, 37), dtype=width, endpoint=True).view(dtype)
        x[0, :4] = [np.inf, -np.inf, np.finfo(dtype).max, np.finfo(dtype).tiny / 2]
        want = int(np.count_nonzero(~np.isfinite(x)))
    assert want > 0
    assert count_stored(x, dtype) == want == count_nonfinite_stored(x, dtype)
    assert count_stored(x[:, ::3], dtype) == (_bf16_reference(x[:, ::3]) if dtype == "bfloat16"
                                              else int(np.count_nonzero(~np.isfinite(x[:, ::3]))))
    assert count_stored(x[:0], dtype) == 0


def test_unknown_pairs_are_left_to_numpy():
    assert count_stored(np.zeros(3, np.float64), "float32") is None
    assert count_stored(np.zeros(3, np.uint16), "float16") is None
