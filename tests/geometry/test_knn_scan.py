"""The compiled tile scans of the neighbour search: every variant gives the one-pass result bit for bit."""

import numpy as np
import pytest
import torch

import geometry
from geometry import _scan, neighbors

from conftest import hypersphere


def _tile(rng, m, p, kind):
    if kind == "signed":  # both signs, many exact ties, zeros of both signs
        D = rng.integers(-40, 40, size=(m, p)).astype(np.float32) / 8
        D[rng.random((m, p)) < 0.01] = -0.0
        return D
    X = rng.normal(size=(m + p, 6)).astype(np.float32)  # distances, with near-duplicate pairs
    X[m : m + 5] = X[:5] + 1e-4
    sq = (X * X).sum(1)
    return (sq[:m, None] + sq[None, m:] - 2 * X[:m] @ X[m:].T).astype(np.float32)


def _lists(rng, n, kc, fill):
    bd = np.full((n, kc), np.inf, np.float32)
    bi = np.full((n, kc), -1, np.int64)
    if fill:  # partly filled lists, ascending, some thresholds negative
        k = kc // 2 + 1
        bd[:, :k] = np.sort(rng.integers(-8, 40, size=(n, k)).astype(np.float32) / 8, axis=1)
        bi[:, :k] = rng.integers(0, n, size=(n, k))
    return bd, bi


@pytest.mark.parametrize("kc", [1, 3, 7])
@pytest.mark.parametrize("kind", ["signed", "distances"])
@pytest.mark.parametrize("fill", [False, True])
@pytest.mark.parametrize("bf16", [True, False])
def test_masked_and_split_scans_equal_the_one_pass_scan(kc, kind, fill, bf16):
    rng = np.random.default_rng(kc + 10 * fill)
    m, p, r0, c0 = 37, 301, 0, 40  # p > one mask segment and not a multiple of 8
    D = _tile(rng, m, p, kind)
    if bf16:
        Dt = torch.from_numpy(D).to(torch.bfloat16)
        Du = Dt.view(torch.int16).numpy().view(np.uint16)
        one = lambda bd, bi: _scan.scan_tile_bf16(Du, neighbors._lut(), r0, c0, False, bd, bi)  # noqa: E731
        off = lambda *a: _scan.scan_offdiag_bf16(Du, r0, c0, *a)  # noqa: E731
    else:
        one = lambda bd, bi: _scan.scan_tile_f32(D, r0, c0, False, bd, bi)  # noqa: E731
        off = lambda *a: _scan.scan_offdiag_f32(D, r0, c0, *a)  # noqa: E731
    ref = _lists(rng, c0 + p, kc, fill)
    start = (ref[0].copy(), ref[1].copy())
    one(*ref)
    splits = [
        [(0, m, 0, p, True, True)],
        [(0, m, 0, p, True, False), (0, m, 0, p, False, True)],
        [(0, m, 0, p, False, True), (0, m, 0, p, True, False)],
        [(0, 20, 0, p, True, False), (0, m, 0, 150, False, True), (20, m, 0, p, True, False),
         (0, m, 150, p, False, True)],
    ]
    for parts in splits:
        bd, bi = start[0].copy(), start[1].copy()
        for a0, a1, b0, b1, rows, cols in parts:
            off(a0, a1, b0, b1, rows, cols, bd, bi)
        np.testing.assert_array_equal(bd, ref[0])
        np.testing.assert_array_equal(bi, ref[1])


@pytest.mark.parametrize("kc", [1, 3, 7])
@pytest.mark.parametrize("kind", ["signed", "distances"])
@pytest.mark.parametrize("fill", [False, True])
@pytest.mark.parametrize("bf16", [True, False])
def test_masked_diagonal_scan_equals_the_one_pass_scan(kc, kind, fill, bf16):
    rng = np.random.default_rng(kc + 10 * fill + 1)
    m, r0 = 290, 17  # more than one mask segment
    D = _tile(rng, m, m, kind)
    D = np.triu(D) + np.triu(D, 1).T  # symmetric, as a diagonal tile is (only its upper half is read)
    ref = _lists(rng, r0 + m, kc, fill)
    start = (ref[0].copy(), ref[1].copy())
    if bf16:
        Du = torch.from_numpy(D).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        _scan.scan_tile_bf16(Du, neighbors._lut(), r0, r0, True, *ref)
        _scan.scan_diag_bf16(Du, r0, *start)
    else:
        _scan.scan_tile_f32(D, r0, r0, True, *ref)
        _scan.scan_diag_f32(D, r0, *start)
    np.testing.assert_array_equal(start[0], ref[0])
    np.testing.assert_array_equal(start[1], ref[1])


def test_threshold_keys_bound_every_smaller_value():
    """v < t implies ordered bits of v <= key(t): the mask never drops a candidate."""
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.normal(size=4000) * 10.0 ** rng.integers(-30, 30, 4000),
                        [0.0, -0.0, np.inf, -np.inf, 1e-40, -1e-40]]).astype(np.float32)
    t = np.concatenate([v[:500], [0.0, -0.0, np.inf, 1e-40, -1e-40]]).astype(np.float32)
    vb = torch.from_numpy(v).to(torch.bfloat16)
    vb16 = vb.view(torch.int16).numpy()
    vb32 = vb.to(torch.float32).numpy()
    scratch = np.empty(1, np.float32)
    for tt in t:
        k16, k32 = _scan._key(tt, True, scratch), _scan._key(tt, False, scratch)
        o16 = np.array([_scan._ordered16(x) for x in vb16])
        o32 = np.array([_scan._ordered32(x) for x in v.view(np.int32)])
        assert (o16[vb32 < tt] <= k16).all()
        assert (o32[v < tt] <= k32).all()


@pytest.mark.parametrize("precision", ["bfloat16x3", "bfloat16", "float32"])
def test_threaded_scan_equals_single_threaded(monkeypatch, precision):
    """Ties (points on a grid: many equal distances) and near-duplicates included."""
    rng = np.random.default_rng(5)
    grid = rng.integers(0, 4, size=(700, 8)).astype(np.float64)
    grid = np.unique(grid, axis=0)
    near = hypersphere(600, 4, seed=9)
    near[300:310] = near[:10] + 1e-9
    for X in (grid, near):
        Xt = torch.from_numpy(X)
        out = []
        for threads in (1, 2, 3):
            monkeypatch.setattr(neighbors, "_SCAN_THREADS", threads)
            out.append(geometry.knn(Xt, 4, chunk_size=128, precision=precision))
        for d, i in out[1:]:
            assert torch.equal(d, out[0][0]) and torch.equal(i, out[0][1])


def _spy_pilot(monkeypatch):
    calls = []
    real = neighbors._pilot

    def spy(*a, **kw):
        out = real(*a, **kw)
        calls.append(out)
        return out

    monkeypatch.setattr(neighbors, "_pilot", spy)
    monkeypatch.setattr(neighbors, "search_precision", lambda dev, p="auto": "bfloat16x3" if p == "auto" else p)
    return calls


def test_auto_pilot_takes_bfloat16_when_it_certifies_and_the_answer_is_exact(monkeypatch):
    calls = _spy_pilot(monkeypatch)
    X = torch.from_numpy(np.vstack([hypersphere(1200, 5, seed=3), hypersphere(4, 5, seed=3) + 1e-9]))
    ref = geometry.knn(X, 2, chunk_size=128, precision="float32")
    out = geometry.knn(X, 2, chunk_size=128)
    assert len(calls) == 1 and calls[0][0] <= neighbors._PILOT_MAX_UNCERTIFIED * calls[0][1]
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_auto_pilot_keeps_bfloat16x3_when_bfloat16_certifies_poorly(monkeypatch):
    """A massive-activation coordinate: norms dwarf neighbour distances, bfloat16's bound fails."""
    calls = _spy_pilot(monkeypatch)
    X = hypersphere(1200, 5, seed=4)
    X[:, 0] += np.random.default_rng(4).choice([-300.0, 300.0], size=1200)
    X = torch.from_numpy(X)
    ref = geometry.knn(X, 2, chunk_size=128, precision="float32")
    out = geometry.knn(X, 2, chunk_size=128)
    assert len(calls) == 1 and calls[0][0] > neighbors._PILOT_MAX_UNCERTIFIED * calls[0][1]
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_no_pilot_for_explicit_precision_large_k_or_small_sets(monkeypatch):
    calls = _spy_pilot(monkeypatch)
    X = torch.from_numpy(hypersphere(1200, 5, seed=5))
    geometry.knn(X, 2, chunk_size=128, precision="bfloat16x3")
    geometry.knn(X, neighbors._PILOT_MAX_K + 1, chunk_size=128)
    geometry.knn(X[:500], 2, chunk_size=128)  # fewer than 4 chunks
    assert calls == []


@pytest.mark.parametrize("precision", ["bfloat16x3", "bfloat16"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_preparation_equals_the_torch_operands(precision, dtype):
    """One compiled pass gives the same centred copy and bfloat16 operands as the torch code
    (the norm columns come from a float64 sum rounded once, so they are checked as a split of sq)."""
    X = torch.from_numpy(hypersphere(300, 5, seed=2) * 3.0 + 7.0).to(dtype)
    X[5] = 0.0  # a zero row
    X[6, :3] = -0.0
    mean = X.mean(dim=0, keepdim=True, dtype=torch.float64)
    Xs_ref = (X.to(torch.float64) - mean).to(torch.float32) if dtype == torch.float64 else X - mean.to(dtype)
    Xs, sq, norms, tile = neighbors._centre_compiled(X.contiguous(), mean, precision)
    assert torch.equal(Xs, Xs_ref)
    ref = neighbors._operands(Xs, sq, precision)
    rows = torch.arange(300)
    e = tile.rows(rows, 0, 300)  # A @ B.T through both operand sets
    assert torch.equal(e, ref.rows(rows, 0, 300))
    np.testing.assert_allclose(norms.numpy(), torch.linalg.vector_norm(Xs.to(torch.float64), dim=1).numpy(),
                               rtol=1e-14)
    np.testing.assert_allclose(sq.numpy(), (norms**2).numpy(), rtol=2**-24)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_row_hashes_equal_torch_and_flag_non_finite_rows(dtype):
    X = torch.from_numpy(np.random.default_rng(1).normal(size=(200, 33))).to(dtype)
    X[3] = 0.0
    X[4] = -0.0  # same hash as the +0.0 row
    X[7, 5], X[9, 0], X[11, 32] = float("nan"), float("inf"), -float("inf")
    h, finite = neighbors._hashes_and_finite(X)
    assert torch.equal(h[finite], neighbors.row_hashes(X)[finite])
    assert h[3] == h[4]
    assert finite.tolist() == [i not in (7, 9, 11) for i in range(200)]
    with pytest.raises(ValueError, match="rows \\[7, 9, 11\\]"):
        geometry.TwoNN().fit(X)


@pytest.mark.parametrize("kc", [1, 3, 4, 6, 10])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_exact_distances_are_the_plain_in_order_float64_sums(kc, dtype):
    rng = np.random.default_rng(kc)
    X = rng.normal(size=(60, 37)).astype(dtype) * 10.0 ** rng.integers(-3, 3, size=(60, 1))
    rows = rng.permutation(60)[:25]
    cand = rng.integers(0, 60, size=(25, kc))
    out = np.empty((25, kc))
    _scan.exact_sq_distances(X, rows, cand, out)
    for a in range(25):
        for c in range(kc):
            s = 0.0
            for t in range(37):
                e = float(X[rows[a], t]) - float(X[cand[a, c], t])
                s += e * e
            assert out[a, c] == s
