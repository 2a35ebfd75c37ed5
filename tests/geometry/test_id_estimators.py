"""TwoNN / MLE: known answers on manifolds in 576-D, agreement with scikit-dimension, bad input."""

import numpy as np
import pytest
import skdim
import torch

import geometry
from conftest import hypersphere


@pytest.mark.parametrize("name", ["sphere2", "sphere5", "swiss_roll", "subspace4"])
@pytest.mark.parametrize("est", [geometry.TwoNN(), geometry.MLE(n_neighbors=20)], ids=["twonn", "mle"])
def test_recovers_known_dimension(clouds, name, est):
    X, d = clouds[name]
    got = est.fit(X).dimension_
    assert abs(got - d) <= 0.1 * d, f"{type(est).__name__} on {name}: {got:.3f} vs true {d}"


@pytest.mark.parametrize("name", ["sphere2", "sphere5", "swiss_roll", "subspace4"])
def test_agrees_with_skdim_within_2_percent(clouds, name):
    X, _ = clouds[name]
    ours_twonn = geometry.TwoNN().fit(X).dimension_
    ref_twonn = skdim.id.TwoNN().fit(X).dimension_
    assert ours_twonn == pytest.approx(ref_twonn, rel=0.02)
    ours_mle = geometry.MLE(n_neighbors=20).fit(X).dimension_
    ref_mle = skdim.id.MLE().fit(X, n_neighbors=20).dimension_
    assert ours_mle == pytest.approx(ref_mle, rel=0.02)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # inside skdim, harmless
def test_twonn_mle_method_and_mle_combinations_agree_with_skdim(clouds):
    X, _ = clouds["sphere5"]
    assert geometry.TwoNN(method="mle", discard_fraction=0.0).fit(X).dimension_ == pytest.approx(
        skdim.id.TwoNN(method="mle", discard_fraction=0.0).fit(X).dimension_, rel=0.02
    )
    for comb in ("mean", "median"):
        ours = geometry.MLE(n_neighbors=10, comb=comb).fit(X).dimension_
        ref = skdim.id.MLE().fit(X, n_neighbors=10, comb=comb).dimension_
        assert ours == pytest.approx(ref, rel=0.02)


def test_chunk_size_does_not_change_the_answer(clouds):
    X, _ = clouds["swiss_roll"]
    a = geometry.TwoNN(chunk_size=4096).fit(X)
    b = geometry.TwoNN(chunk_size=700).fit(X)
    assert a.dimension_ == pytest.approx(b.dimension_, rel=1e-9)
    np.testing.assert_allclose(a.mu_, b.mu_, rtol=1e-9)


def test_knn_matches_sklearn():
    from sklearn.neighbors import NearestNeighbors

    X = np.random.default_rng(0).normal(size=(700, 40))
    d, i = geometry.knn(torch.from_numpy(X), 7, chunk_size=128)
    D, I = NearestNeighbors(n_neighbors=7).fit(X).kneighbors()
    np.testing.assert_allclose(d.numpy(), D, atol=1e-10)
    assert (i.numpy() == I).mean() > 0.999


def test_accepts_torch_float32_and_lists(clouds):
    X, _ = clouds["sphere2"]
    ref = geometry.TwoNN().fit(X).dimension_
    assert geometry.TwoNN().fit(torch.tensor(X, dtype=torch.float32)).dimension_ == pytest.approx(ref, rel=1e-3)
    small = X[:50]
    assert geometry.TwoNN().fit(small.tolist()).dimension_ == pytest.approx(geometry.TwoNN().fit(small).dimension_)


def test_duplicates_are_dropped_and_counted():
    X = hypersphere(500, 3, seed=5)
    Xd = np.vstack([X, X[:40], X[:10]])
    est = geometry.TwoNN().fit(Xd)
    assert est.n_duplicates_ == 50
    assert est.dimension_ == pytest.approx(geometry.TwoNN().fit(X).dimension_, rel=1e-9)
    assert np.isfinite(est.dimension_)
    mle = geometry.MLE(n_neighbors=10).fit(Xd)
    assert mle.n_duplicates_ == 50 and np.isfinite(mle.dimension_)
    np.testing.assert_array_equal(est.sample_index_, np.arange(500))


@pytest.mark.parametrize(
    "X, est, match",
    [
        (np.random.default_rng(0).normal(size=(15, 8)), geometry.MLE(n_neighbors=20), r"at least 21 distinct points; got 15"),
        (np.random.default_rng(0).normal(size=(2, 8)), geometry.TwoNN(), r"at least 3 distinct points; got 2"),
        (np.ones((30, 8)), geometry.TwoNN(), r"all the same point"),
        (np.ones((30, 8)), geometry.MLE(), r"all the same point"),
        (np.r_[np.random.default_rng(0).normal(size=(30, 4)), [[np.nan, 0, 0, 0]]], geometry.TwoNN(), r"NaN or inf, at rows \[30\]"),
        (np.r_[np.random.default_rng(0).normal(size=(30, 4)), [[np.inf, 0, 0, 0]]], geometry.MLE(n_neighbors=5), r"NaN or inf"),
        (np.zeros((3, 4, 5)), geometry.TwoNN(), r"2-D .* got shape \(3, 4, 5\)"),
    ],
    ids=["too-few-for-k", "too-few-twonn", "single-point-twonn", "single-point-mle", "nan", "inf", "3d"],
)
def test_bad_input_raises_clear_value_error(X, est, match):
    with pytest.raises(ValueError, match=match):
        est.fit(X)


def test_bad_parameters_raise():
    X = hypersphere(100, 2)
    with pytest.raises(ValueError, match="method must be"):
        geometry.TwoNN(method="ols").fit(X)
    with pytest.raises(ValueError, match="n_neighbors must be"):
        geometry.MLE(n_neighbors=1).fit(X)
    with pytest.raises(ValueError, match="unknown scikit-dimension estimator 'Nope'"):
        geometry.skdim_estimator("Nope")


def test_skdim_wrapper_by_name(clouds):
    X, d = clouds["subspace4"]
    assert geometry.skdim_estimator("lPCA").fit(X[:500]).dimension_ == d
    est = geometry.make_estimator("skdim:TwoNN").fit(torch.from_numpy(X))
    assert est.dimension_ == pytest.approx(geometry.TwoNN().fit(X).dimension_, rel=1e-6)
    # any other skdim estimator by name (MADA is quick; DANCo/ESS work too but JIT-compile slowly)
    mada = geometry.skdim_estimator("mada").fit(X[:300])
    assert 3 <= mada.dimension_ <= 5.5 and mada.n_duplicates_ == 0


def test_sklearn_contract():
    from sklearn.base import clone

    est = geometry.MLE(n_neighbors=7, comb="mean")
    assert est.get_params()["n_neighbors"] == 7
    assert clone(est).get_params() == est.get_params()
    assert est.fit(hypersphere(100, 2)) is est
    assert est.dimension_pw_.shape == (100,) and est.n_features_in_ == 576


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_drop_duplicates_exact_rows_any_dtype(dtype):
    X = torch.from_numpy(np.random.default_rng(3).normal(size=(300, 12))).to(dtype)
    zero, negzero = torch.zeros(1, 12, dtype=dtype), -torch.zeros(1, 12, dtype=dtype)
    Xd = torch.cat([X, X[5:25], zero, negzero, X[:3]])
    U, kept = geometry.drop_duplicates(Xd)
    assert U.shape[0] == 301 and kept.tolist() == list(range(300)) + [320]
    near = X.clone()
    near[7, 0] = torch.nextafter(near[7, 0], torch.tensor(10.0, dtype=dtype)) if dtype != torch.float16 else near[7, 0] + 0.01
    assert geometry.drop_duplicates(torch.cat([X, near[7:8]]))[0].shape[0] == 301  # not an exact copy


@pytest.mark.parametrize("precision", ["bfloat16x3", "bfloat16", "float32"])
def test_knn_every_precision_and_the_torch_path_give_the_same_answer(monkeypatch, precision):
    """The candidate search's precision and scan (compiled on CPU, torch elsewhere) change only the
    speed: certification and re-search make the neighbours and distances the same."""
    from geometry import knn_tiles

    X = torch.from_numpy(np.vstack([hypersphere(900, 4, seed=7), hypersphere(3, 4, seed=7)[:3] + 1e-9]))
    ref_d, ref_i = geometry.knn(X, 5, chunk_size=256, precision="float32")
    d, i = geometry.knn(X, 5, chunk_size=256, precision=precision)
    np.testing.assert_array_equal(d.numpy(), ref_d.numpy())
    np.testing.assert_array_equal(i.numpy(), ref_i.numpy())
    monkeypatch.setattr(knn_tiles, "_USE_COMPILED", False)  # where the tile path is chosen
    d2, i2 = geometry.knn(X, 5, chunk_size=256, precision=precision)
    np.testing.assert_allclose(d2.numpy(), ref_d.numpy(), rtol=1e-12)
    assert (i2.numpy() == ref_i.numpy()).mean() > 0.999
