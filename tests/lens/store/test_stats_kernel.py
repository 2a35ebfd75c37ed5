"""lens.store.stats' compiled per-shard sums write the same bytes as the numpy code that wrote every store
before them (kept here as ``reference_block_sums``): stores written before still verify, merges of old and new
parts add the same numbers, and the anisotropy results read from them do not move.

Random blocks of float32, float16 and bfloat16 (as uint16 bit patterns), with all-zero rows, negative zeros,
non-finite values, tokens of all four groups and row counts that are not multiples of CHUNK_ROWS; compared as
bytes (``tobytes``). One exception, NaN payloads: where a column sum meets two NaNs of different payloads or
signs (a data NaN after an inf - inf), numpy's add keeps the sum's NaN in its SIMD body and, on x86 builds, the
row's in its scalar tail (the last d mod 16 columns on AVX-512), so numpy's own bytes depend on the CPU. The
compiled pass keeps the sum's NaN in every column (numpy's body); the comparison maps every NaN to one pattern.
A NaN sum is a flagged store either way (the nonfinite counts), and every statistic read from it is NaN."""

from __future__ import annotations

import numpy as np
import pytest

from lens.store import stats
from lens.store.stats import CHUNK_ROWS, GROUPS, HEAD, block_sums, shard_sums


def reference_widen(a, dtype):
    if dtype == "bfloat16":
        a = (np.asarray(a).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(a, dtype=np.float64)


def reference_sums(x, d):
    o = np.empty(HEAD + 3 * d)
    sq = np.einsum("ij,ij->i", x, x)
    norm = np.sqrt(sq)
    zero = norm == 0
    o[0], o[1], o[2] = x.shape[0], np.count_nonzero(zero), sq.sum()
    o[HEAD:HEAD + d] = x.sum(axis=0)
    x /= np.where(zero, 1.0, norm)[:, None]
    o[HEAD + d:HEAD + 2 * d] = x.sum(axis=0)
    np.square(x, out=x)
    o[HEAD + 2 * d:] = x.sum(axis=0)
    return o


def reference_block_sums(block, dtype, groups, n_groups=len(GROUPS)):
    """The numpy implementation lens.store.stats had until the compiled pass (commit a18095b)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        n, d = block.shape
        out = np.zeros((n_groups, HEAD + 3 * d), dtype=np.float64)
        for lo in range(0, n, CHUNK_ROWS):
            g = groups[lo:lo + CHUNK_ROWS]
            raw = block[lo:lo + CHUNK_ROWS]
            rest = np.flatnonzero(g)
            group_rest = np.zeros_like(out)
            for k in range(1, n_groups):
                rows = rest[g[rest] == k]
                if len(rows):
                    group_rest[k] = reference_sums(reference_widen(raw[rows], dtype), d)
            total = reference_sums(reference_widen(raw, dtype), d)
            out[0] += total - group_rest[1:].sum(axis=0)
            out[1:] += group_rest[1:]
        return out


def _same(got, want) -> bool:
    """Byte-identical, every NaN taken as one pattern (see the module's note)."""
    got, want = got.copy(), want.copy()
    got[np.isnan(got)] = np.nan
    want[np.isnan(want)] = np.nan
    return got.tobytes() == want.tobytes()


def _block(rng, n, d, dtype, nonfinite):
    x = rng.standard_normal((n, d)).astype(np.float32) * np.exp(rng.uniform(-8, 8, (n, 1))).astype(np.float32)
    x[rng.random(n) < 0.05] = 0.0  # all-zero rows
    x[rng.random(n) < 0.02] = -0.0
    x[rng.random((n, d)) < 0.01] = -0.0
    if nonfinite:
        hit = rng.random((n, d)) < 0.002
        x[hit] = rng.choice(np.array([np.inf, -np.inf, np.nan, -np.nan], dtype=np.float32), size=int(hit.sum()))
        if n > 3:
            x[3] = np.float32(3e38)  # squares overflow to inf in float64? no: but its bf16/f16 casts do
    if dtype == "bfloat16":
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    with np.errstate(over="ignore"):
        return x.astype(np.float16 if dtype == "float16" else np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n,d", [(1, 1), (7, 1), (1500, 1), (1, 3), (5, 2), (1000, 17), (2500, 64), (2049, 96)])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_block_sums_bytes_equal_the_numpy_reference(dtype, n, d, nonfinite):
    rng = np.random.default_rng([n, d, len(dtype), nonfinite])
    block = _block(rng, n, d, dtype, nonfinite)
    groups = rng.choice(4, size=n, p=[0.85, 0.05, 0.05, 0.05]).astype(np.int8)
    got = block_sums(block, dtype, groups)
    want = reference_block_sums(block, dtype, groups)
    assert got.tobytes() == want.tobytes() if not nonfinite else _same(got, want)
    two = (rng.random(n) < 0.3).astype(np.int8)  # the two-group form (a mask that is no union of groups)
    assert _same(block_sums(block, dtype, two, 2), reference_block_sums(block, dtype, two, 2))


def test_shard_sums_of_memmapped_layers_equal_the_reference(tmp_path):
    """As the writer calls it: one memmapped (layer, token, d) file, a layer block at a time."""
    rng = np.random.default_rng(5)
    data = np.stack([_block(rng, 3000, 48, "bfloat16", True) for _ in range(3)])
    path = tmp_path / "b.npy"
    np.save(path, data)
    mm = np.load(path, mmap_mode="r")
    groups = stats.token_groups(rng.random(3000) < 0.1, np.arange(3000) % 256)
    got = shard_sums((mm[i] for i in range(3)), "bfloat16", groups)
    want = np.stack([reference_block_sums(data[i], "bfloat16", groups) for i in range(3)], axis=1)
    assert _same(got, want)
    assert np.isnan(got).any() and np.isfinite(got).any()


def test_a_nan_sum_keeps_its_first_nan():
    """Two NaNs of different payloads in one column: the sum keeps the first (numpy's SIMD body does the
    same); signed zeros (0.0 + -0.0 starts every column, as numpy's) and inf - inf as in the reference."""
    d = 4
    x = np.zeros((6, d), dtype=np.float32)
    x[:, 0] = -0.0
    x[1, 1] = np.frombuffer(np.uint32(0x7FC00001).tobytes(), np.float32)[0]
    x[4, 1] = np.frombuffer(np.uint32(0xFFC00002).tobytes(), np.float32)[0]
    x[2, 2], x[3, 2] = np.inf, -np.inf
    x[:, 3] = 1.0
    groups = np.zeros(6, dtype=np.int8)
    got = block_sums(x, "float32", groups)
    assert _same(got, reference_block_sums(x, "float32", groups))
    assert got[0, HEAD + 1].tobytes() == np.float64(x[1, 1]).tobytes()
    assert got[0, HEAD] == 0 and not np.signbit(got[0, HEAD])
