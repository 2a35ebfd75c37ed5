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


def _brute_force_loo_alpha(X, Y, alphas):
    """The α with the least leave-one-out squared error, by refitting without each sample."""
    from sklearn.linear_model import Ridge

    errs = []
    for a in alphas:
        e = 0.0
        for i in range(len(X)):
            keep = np.arange(len(X)) != i
            pred = Ridge(alpha=a).fit(X[keep], Y[keep]).predict(X[i:i + 1])
            e += float(((Y[i] - pred) ** 2).sum())
        errs.append(e)
    return alphas[int(np.argmin(errs))], errs


def test_ridge_loo_basis_hat_diagonal_and_alpha_equal_brute_force_loo():
    from probes.ridge_cv import LOOBasis, RidgeLOO

    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 5)) * [1, 2, 3, 4, 5] + 2.0
    y = X @ rng.normal(size=5) + 3.0 * rng.normal(size=40)
    alphas = (0.01, 3.0, 30.0, 300.0, 3000.0)
    basis = LOOBasis(X, alphas)
    # hat diagonal of the intercept + ridge fit, from its explicit matrix
    Xc = X - X.mean(0)
    for j, a in enumerate(alphas):
        H = Xc @ np.linalg.solve(Xc.T @ Xc + a * np.eye(5), Xc.T) + 1.0 / len(X)
        np.testing.assert_allclose(basis.h[:, j].numpy(), np.diag(H), rtol=1e-12)
    want, _ = _brute_force_loo_alpha(X, y, alphas)
    assert RidgeLOO(alphas).fit(X, y).alpha_ == want
    yc = (y > np.median(y)).astype(int)
    want_c, _ = _brute_force_loo_alpha(X, np.where(yc == 1, 1.0, -1.0), alphas)
    assert RidgeLOO(alphas).fit(X, yc).alpha_ == want_c


def test_ridge_loo_fit_many_is_fit_per_target_to_the_bit():
    from probes.ridge_cv import RidgeLOO

    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 8)).astype(np.float32)
    ys = [(X[:, 0] > 0).astype(int), rng.integers(0, 3, 200), rng.integers(0, 2, 200)]
    many = RidgeLOO().fit_many(X, ys)
    for y, m in zip(ys, many):
        one = RidgeLOO().fit(X, y)
        assert m.alpha_ == one.alpha_ and np.array_equal(m.coef_, one.coef_)
        assert np.array_equal(m.intercept_, one.intercept_) and np.array_equal(m.classes_, one.classes_)
    with pytest.raises(ValueError, match="at least one target"):
        RidgeLOO().fit_many(X, [])
    with pytest.raises(ValueError, match="200 entries"):
        RidgeLOO().fit(X, ys[0][:-1])
    with pytest.raises(ValueError, match="at least 2 samples"):
        RidgeLOO().fit(X[:1], ys[0][:1])


@pytest.mark.parametrize("kind", ["ridge", "logistic"])
@pytest.mark.parametrize("strength", ["shared", "per_task"])
def test_probe_with_control_equals_the_two_tasks_fitted_apart(kind, strength):
    """The real and the control task share each fold's scaling and decomposition; each task's scores
    are those of fitting it alone on the same folds (to the bit): "shared", the control task with the
    strength the real task chose in that fold (one probe configuration, Hewitt & Liang); "per_task",
    with its own choice."""
    from sklearn.preprocessing import StandardScaler

    from probes.ridge_cv import RidgeLOO

    X, y, types, docs = _planted(n=300, n_layers=3)
    probe = LinearProbe(kind=kind, n_folds=3, Cs=(0.1, 1.0), control_strength=strength).fit(
        X, y, word_types=types, groups=docs)
    both = probe.result_
    folds = probe._folds(len(y), y, docs)
    yc = control_labels(y, types, 0)
    for i in range(3):
        real, control = [], []
        for tr, te in folds:
            sc = StandardScaler().fit(X[i][tr])
            Xtr, Xte = sc.transform(X[i][tr]), sc.transform(X[i][te])
            if kind == "ridge":
                m = RidgeLOO(probe.alphas, classification=True).fit(Xtr, y[tr])
                real.append(m.score(Xte, y[te]))
                grid = (m.alpha_,) if strength == "shared" else probe.alphas
                control.append(RidgeLOO(grid, classification=True).fit(Xtr, yc[tr]).score(Xte, yc[te]))
            else:
                s, c = probe._logistic_fold(Xtr, y[tr], Xte, y[te])[:2]
                real.append(s)
                control.append(probe._logistic_fold(Xtr, yc[tr], Xte, yc[te], c if strength == "shared" else None)[0])
        assert float(np.mean(real)) == both.accuracy[i]
        assert float(np.mean(control)) == both.control_accuracy[i]


def test_the_shared_strength_is_the_real_tasks_and_per_task_may_differ():
    """With one probe configuration the control task's chosen strength is the real task's on every fold;
    the per-task variant picks another where the control task prefers it (planted: the real task is
    linear, the control task is memorisation, which a weak ridge fits better)."""
    from probes.ridge_cv import RidgeLOO

    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 40))
    ys = [(X[:, 0] > 0).astype(int), rng.integers(0, 2, 300)]
    grid = (1e-3, 1.0, 1e3, 1e6)
    shared = RidgeLOO(grid).fit_many(X, ys, same_alpha=True)
    apart = RidgeLOO(grid).fit_many(X, ys)
    assert shared[1].alpha_ == shared[0].alpha_ == apart[0].alpha_
    assert apart[1].alpha_ != apart[0].alpha_
    with pytest.raises(ValueError, match="control_strength"):
        LinearProbe(control_strength="both").fit(X[None], ys[0], word_types=np.arange(300) % 7)
