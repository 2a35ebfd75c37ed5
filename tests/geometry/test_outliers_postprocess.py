"""Positional outlier neurons and the post-processing toggles."""

import numpy as np
import pytest

import geometry


def test_positional_outlier_neuron_is_found_and_correlates_with_position():
    rng = np.random.default_rng(0)
    pos = np.tile(np.arange(64), 20)
    layers = []
    for _ in range(4):
        X = rng.normal(size=(pos.size, 96))
        X[:, 17] += 8.0 + 0.2 * pos  # huge and position-dependent
        layers.append(X)
    res = geometry.outlier_neurons(layers, pos)
    assert res.persistent_dims.tolist() == [17]
    assert res.persistent_layer_fraction[0] == 1.0
    assert res.persistent_position_corr[0] > 0.9
    assert res.extreme_share[:, 17].min() > 0.9
    assert res.magnitude.shape == res.position_corr.shape == (4, 96)


def test_outlier_neurons_errors():
    with pytest.raises(ValueError, match="positions has 5 entries but layer 0 has 10 tokens"):
        geometry.outlier_neurons([np.ones((10, 3))], np.arange(5))


def test_standardize_and_whiten():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(500, 8)) @ rng.normal(size=(8, 8)) + 3.0
    Z = geometry.standardize(X).numpy()
    np.testing.assert_allclose(Z.mean(0), 0, atol=1e-10)
    np.testing.assert_allclose(Z.std(0, ddof=1), 1, atol=1e-10)
    W = geometry.zca_whiten(X).numpy()
    np.testing.assert_allclose(np.cov(W.T), np.eye(8), atol=1e-4)


def test_remove_and_clip():
    X = np.random.default_rng(2).normal(size=(300, 10))
    X[:, 4] += 50
    Y, removed = geometry.remove_top_dims(X, k=1)
    assert removed.tolist() == [4] and Y.shape == (300, 9)
    C = geometry.clip_outliers(X, n_sigma=6).numpy()
    assert C[:, 4].max() < 10 and np.allclose(C[:, 0], X[:, 0])
    with pytest.raises(ValueError, match="out-of-range"):
        geometry.remove_dims(X, [10])
    for name in geometry.POSTPROCESSING:
        assert geometry.postprocess(X, name).shape[0] == 300


def test_check_finite_rows_names_bad_rows_and_passes_rows_whose_sum_overflows():
    import torch

    from geometry.arrays import check_finite_rows

    X = torch.ones((9000, 4), dtype=torch.float32)
    X[3, 1] = 3e38
    X[3, 2] = 3e38  # finite, but the row sums to inf in float32: the exact check decides
    check_finite_rows(X)
    X[5000, 0], X[8999, 3], X[7, 2] = float("nan"), float("-inf"), float("inf")
    with pytest.raises(ValueError, match=r"got 3 row\(s\) with NaN or inf, at rows \[7, 5000, 8999\]"):
        check_finite_rows(X)
    check_finite_rows(torch.zeros((0, 3)))  # nothing to check


def test_position_correlation_equals_float64_pearson():
    import torch

    from geometry.outliers import _pearson_columns

    rng = np.random.default_rng(4)
    pos = np.tile(np.arange(1, 128), 80).astype(np.float64)
    X = (rng.normal(size=(pos.size, 6)) + 300.0).astype(np.float32)  # a large offset: centring must be float64
    X[:, 1] = 2.0 * pos - 5.0  # exactly linear in position
    X[:, 2] = 7.0  # constant: no correlation
    got = _pearson_columns(torch.from_numpy(X), torch.from_numpy(pos), chunk=1000).numpy()
    X64 = X.astype(np.float64)
    want = np.array([np.corrcoef(X64[:, j], pos)[0, 1] if j != 2 else np.nan for j in range(6)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert got[1] == pytest.approx(1.0, abs=1e-14) and np.isnan(got[2])
    # float64 rows: the same formula
    np.testing.assert_allclose(_pearson_columns(torch.from_numpy(X64), torch.from_numpy(pos)).numpy(), want,
                               rtol=1e-12, atol=1e-14)


def test_magnitudes_in_chunks_equal_one_reduction():
    import torch

    from geometry.outliers import _magnitudes

    X = torch.from_numpy(np.random.default_rng(6).standard_t(3, size=(9000, 7)).astype(np.float32))
    total, arg = _magnitudes(X)
    assert torch.equal(total, X.abs().sum(dim=0, dtype=torch.float64))
    assert torch.equal(arg, X.abs().argmax(dim=1))
    total, arg = _magnitudes(X[:5], chunk=2)  # known answer on a few rows
    np.testing.assert_allclose(total, np.abs(X[:5].numpy().astype(np.float64)).sum(0), rtol=1e-15)
    assert arg.tolist() == np.abs(X[:5].numpy()).argmax(1).tolist()
