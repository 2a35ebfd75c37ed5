"""Linear probe with control task, scalar mix and character labels: planted answers."""

import numpy as np
import pytest
import torch

from probes.linear_probe import LinearProbe, char_labels, control_labels
from probes.scalar_mix import ScalarMixProbe


def _planted(n=600, d=12, n_layers=4, signal_layer=2, n_types=16, seed=0, identity=True):
    """Labels are a property of the token (word) type; only ``signal_layer`` encodes them linearly,
    the last layer encodes word identity (a random code per type) but not the label linearly."""
    rng = np.random.default_rng(seed)
    types = rng.integers(0, n_types, n)
    type_label = rng.integers(0, 2, n_types)
    y = type_label[types]
    X = rng.normal(size=(n_layers, n, d)).astype(np.float32)
    X[signal_layer, :, 0] += 3.0 * (2 * y - 1)
    if identity:
        X[-1] += 2.0 * rng.normal(size=(n_types, d)).astype(np.float32)[types]
    docs = np.arange(n) // 20
    return X, y, types, docs


def test_probe_finds_signal_layer_and_selectivity():
    X, y, types, docs = _planted()
    est = LinearProbe(kind="logistic", Cs=(0.1, 1.0), n_folds=3).fit(X, y, word_types=types, groups=docs)
    r = est.result_
    assert r.accuracy[2] > 0.95
    assert r.accuracy[0] < r.majority + 0.1 and r.accuracy[1] < r.majority + 0.1
    # the type-identity layer also solves the control task (memorisation): low selectivity
    assert r.control_accuracy[3] > r.control_accuracy[2] + 0.15
    assert r.selectivity[2] > r.selectivity[3] + 0.15
    assert abs(r.majority - max(y.mean(), 1 - y.mean())) < 0.1
    assert r.metric == "accuracy" and r.accuracy.shape == (4,)


def test_ridge_probe_classification_and_regression():
    X, y, types, docs = _planted()
    r = LinearProbe(kind="ridge", n_folds=3, control=False).fit(torch.tensor(X), y).result_
    assert r.best_layer == 2 and np.all(np.isnan(r.control_accuracy))
    target = X[1, :, 3] * 2.0 + 0.1 * np.random.default_rng(1).normal(size=X.shape[1])
    rr = LinearProbe(kind="ridge", n_folds=3, control=False).fit(X, target.astype(np.float64)).result_
    assert rr.metric == "r2" and rr.best_layer == 1 and rr.accuracy[1] > 0.95


def test_control_labels_are_per_type_with_the_label_distribution():
    rng = np.random.default_rng(0)
    types = rng.integers(0, 500, 20000)
    y = (rng.random(20000) < 0.3).astype(int)
    c = control_labels(y, types, seed=1)
    for t in np.unique(types)[:50]:
        assert len(np.unique(c[types == t])) == 1
    assert abs(c.mean() - 0.3) < 0.06


def test_char_labels():
    toks = ["Ġthe", "▁Apple", "##ing", "Ċ", "xyz", "G"]
    assert char_labels(toks, "e").tolist() == [True, True, False, False, False, False]
    assert char_labels(toks, "g").tolist() == [False, False, True, False, False, True]
    with pytest.raises(ValueError, match="single character"):
        char_labels(toks, "ab")


def test_scalar_mix_weights_find_the_layer():
    X, y, _, docs = _planted(n=600, n_layers=5, signal_layer=3, identity=False)
    est = ScalarMixProbe(n_epochs=100).fit(X, y, groups=docs)
    assert int(np.argmax(est.weights_)) == 3 and est.weights_[3] > 0.5
    assert abs(est.weights_.sum() - 1) < 1e-6 and est.accuracy_ > 0.9


@pytest.mark.parametrize("kwargs, args, match", [
    ({}, lambda X, y, t, d: (X, y * 0, t, d), "at least 2 classes"),
    ({}, lambda X, y, t, d: (X, y[:-1], t, d), "labels: expected 600"),
    ({}, lambda X, y, t, d: (X, y, None, d), "word_types"),
    ({}, lambda X, y, t, d: (X, y, t, d * 0), "distinct groups"),
    ({"kind": "svm"}, lambda X, y, t, d: (X, y, t, d), "kind"),
    ({}, lambda X, y, t, d: (np.where(X > 3, np.nan, X), y, t, d), "NaN"),
])
def test_probe_bad_input(kwargs, args, match):
    X, y, types, docs = _planted()
    Xb, yb, tb, db = args(X, y, types, docs)
    with pytest.raises(ValueError, match=match):
        LinearProbe(n_folds=3, **kwargs).fit(Xb, yb, word_types=tb, groups=db)


def test_scalar_mix_bad_input():
    X, y, _, docs = _planted()
    with pytest.raises(ValueError, match="at least 2 classes"):
        ScalarMixProbe().fit(X, y * 0)
    with pytest.raises(ValueError, match="2 distinct groups"):
        ScalarMixProbe().fit(X, y, groups=docs * 0)


def test_ridge_loo_equals_sklearn():
    from sklearn.linear_model import RidgeClassifierCV, RidgeCV

    from probes.ridge_cv import RidgeLOO

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 10)) + 1.0
    w = rng.normal(size=10)
    alphas = (0.01, 1.0, 30.0, 1000.0)
    for y in ((X @ w + rng.normal(size=300) > 1).astype(int), rng.integers(0, 3, 300) + (X[:, 0] > 1)):
        ours, sk = RidgeLOO(alphas).fit(X, y), RidgeClassifierCV(alphas=alphas).fit(X, y)
        assert ours.alpha_ == sk.alpha_
        np.testing.assert_allclose(ours.decision_function(X).squeeze(), sk.decision_function(X), atol=1e-8)
        assert (ours.predict(X) == sk.predict(X)).all()
    yr = X @ w + rng.normal(size=300)
    ours, sk = RidgeLOO(alphas).fit(X, yr), RidgeCV(alphas=alphas).fit(X, yr)
    assert ours.alpha_ == sk.alpha_ and abs(ours.score(X, yr) - sk.score(X, yr)) < 1e-10
