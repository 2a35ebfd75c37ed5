"""The closed-form one-hot ridge from sufficient statistics against explicit matrices."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from probes.ridge_closed_form import F64, Moments, fit_moments, rss, scalar_in_sample_rss, token_residuals


def _moments(X, cls, n_classes, tgt=None):
    m = Moments.zeros(X.shape[1], n_classes, "cpu")
    x = torch.as_tensor(X, dtype=F64)
    c = torch.as_tensor(cls)
    t = torch.as_tensor(cls if tgt is None else tgt, dtype=F64)
    for s in range(0, len(x), 37):                    # in chunks, as the estimator adds them
        m.add_rows(x[s:s + 37], c[s:s + 37], t[s:s + 37])
    return m


def _problem(seed=0, n=400, d=6, C=25):
    rng = np.random.default_rng(seed)
    cls = rng.integers(0, C - 5, n)                   # the last 5 classes never occur
    X = rng.normal(size=(n, d)) + np.eye(C)[cls][:, :d] * 2 + 1.5
    return X, cls, C


def test_moments_per_class_sums_and_centring():
    X, cls, C = _problem()
    m = _moments(X, cls, C)
    R = np.zeros((C, X.shape[1]))
    np.add.at(R, cls, X)
    np.testing.assert_allclose(m.class_sums(torch.arange(C)).numpy(), R, rtol=1e-13)
    np.testing.assert_array_equal(m.counts.numpy(), np.bincount(cls, minlength=C))
    assert m.classes().tolist() == sorted(set(cls.tolist()))
    mu = torch.as_tensor(X.mean(0) + 0.3)
    cols = torch.tensor([0, 3, C - 1])
    G, u = m.gram(mu)
    B = m.centred_class_rows(cols, mu)
    Xc = X - mu.numpy()
    np.testing.assert_allclose(G.numpy(), Xc.T @ Xc, rtol=1e-10)
    np.testing.assert_allclose(B.numpy(), (Xc.T @ np.eye(C)[cls])[:, cols.numpy()].T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(u.numpy(), Xc.sum(0), rtol=1e-10, atol=1e-12)


def test_sets_hold_their_own_classes_and_sums_share_them():
    """A set made for some classes holds sums for those only; the sum of two sets shares their tables
    (no copy) and gives the per-class sums and class Grams of the union, in any block size."""
    from probes.ridge_closed_form import class_gram

    X, cls, C = _problem(seed=3)
    a, b = slice(0, 250), slice(250, None)
    ma = Moments.zeros(X.shape[1], C, "cpu", classes=torch.as_tensor(np.unique(cls[a])))
    mb = Moments.zeros(X.shape[1], C, "cpu", classes=torch.as_tensor(np.unique(cls[b])))
    for m, sl in ((ma, a), (mb, b)):
        m.add_rows(torch.as_tensor(X[sl], dtype=F64), torch.as_tensor(cls[sl]), torch.as_tensor(cls[sl], dtype=F64))
    assert ma.parts[0].R.shape[0] == len(np.unique(cls[a]))
    both = ma + mb
    assert both.parts[0].R is ma.parts[0].R and both.parts[1].R is mb.parts[0].R
    whole = _moments(X, cls, C)
    every = torch.arange(C)
    np.testing.assert_allclose(both.class_sums(every).numpy(), whole.class_sums(every).numpy(), rtol=1e-12)
    mu = torch.as_tensor(X.mean(0))
    Bc = whole.centred_class_rows(every, mu).numpy()
    for block in (1, 3, 2048):
        got, wsum = class_gram(both, mu, weights=torch.arange(C, dtype=F64), block=block)
        np.testing.assert_allclose(got.numpy(), Bc.T @ Bc, rtol=1e-10)
        np.testing.assert_allclose(wsum.numpy(), Bc.T @ np.arange(C), rtol=1e-10)
    # the cross Gram of two sets runs over the classes both hold
    cross, _ = class_gram(ma, mu, e=mb, block=2)
    Ba, Bb = ma.centred_class_rows(every, mu).numpy(), mb.centred_class_rows(every, mu).numpy()
    np.testing.assert_allclose(cross.numpy(), Ba.T @ Bb, rtol=1e-10, atol=1e-10)
    # from the tables' uncentred products, each pair multiplied once (a cache shared by every call)
    cache = {}
    for _ in range(2):
        got, wsum = class_gram(both, mu, weights=torch.arange(C, dtype=F64), cache=cache)
        np.testing.assert_allclose(got.numpy(), Bc.T @ Bc, rtol=1e-10)
        np.testing.assert_allclose(wsum.numpy(), Bc.T @ np.arange(C), rtol=1e-10)
        got, _ = class_gram(mb, mu, e=ma, cache=cache)
        np.testing.assert_allclose(got.numpy(), Bb.T @ Ba, rtol=1e-10, atol=1e-10)
    assert len(cache) == 3  # a·a, a·b (b·a is its transpose), b·b
    with pytest.raises(ValueError, match="not among the classes"):
        ma.add_rows(torch.zeros(1, X.shape[1], dtype=F64), torch.tensor([C - 1]), torch.zeros(1, dtype=F64))
    with pytest.raises(ValueError, match="sum of sets"):
        both.add_rows(torch.zeros(1, X.shape[1], dtype=F64), torch.tensor([int(cls[0])]), torch.zeros(1, dtype=F64))


def test_rss_equals_sklearn_ridge_in_and_out_of_sample():
    X, cls, C = _problem()
    tr, te = slice(0, 300), slice(300, None)
    m_tr, m_te = _moments(X[tr], cls[tr], C), _moments(X[te], cls[te], C)
    fit = fit_moments(m_tr)
    Y = np.eye(C)[cls]
    lams = [0.1, 10.0]
    got_te, got_tr = rss(fit, m_te, torch.tensor(lams)), rss(fit, m_tr, torch.tensor(lams))
    for k, lam in enumerate(lams):
        sk = Ridge(alpha=lam).fit(X[tr], Y[tr])
        assert float(got_te[k]) == pytest.approx(((sk.predict(X[te]) - Y[te]) ** 2).sum(), rel=1e-10)
        assert float(got_tr[k]) == pytest.approx(((sk.predict(X[tr]) - Y[tr]) ** 2).sum(), rel=1e-10)
        np.testing.assert_allclose(fit.weights(lam).numpy(), sk.coef_.T, rtol=1e-8, atol=1e-12)
        # per-token residuals of the test rows, only their classes' columns built
        cache = {"needed": torch.unique(torch.as_tensor(cls[te]))}
        per_tok = token_residuals(fit, lam, torch.as_tensor(X[te], dtype=F64), torch.as_tensor(cls[te]), cache)
        np.testing.assert_allclose(per_tok.numpy(), ((sk.predict(X[te]) - Y[te]) ** 2).sum(1), rtol=1e-9)


def test_in_sample_only_fit_skips_m_and_scores_the_same():
    X, cls, C = _problem(seed=1)
    m = _moments(X, cls, C, tgt=cls * 3.0 + 1.0)
    full, lean = fit_moments(m), fit_moments(m, in_sample_only=True)
    assert lean.M is None and full.M is not None
    np.testing.assert_allclose(lean.m_diag.numpy(), torch.diagonal(full.M).numpy(), rtol=1e-13)
    lams = torch.tensor([1e-3, 1.0, 100.0], dtype=F64)
    np.testing.assert_allclose(rss(lean, m, lams).numpy(), rss(full, m, lams).numpy(), rtol=1e-12)
    # the scalar token-id target reuses the fit's eigendecomposition
    for lam in (1e-3, 5.0):
        shared, own = scalar_in_sample_rss(m, lam, lean), scalar_in_sample_rss(m, lam)
        assert shared[1] == own[1] and shared[0] == pytest.approx(own[0], rel=1e-10)
        t = cls * 3.0 + 1.0
        sk = Ridge(alpha=lam).fit(X, t)
        assert shared[0] == pytest.approx(((sk.predict(X) - t) ** 2).sum(), rel=1e-9)
    other = _moments(X[:100], cls[:100], C)
    with pytest.raises(ValueError, match="in-sample only"):
        rss(lean, other, lams)
    with pytest.raises(ValueError, match="same moments"):
        scalar_in_sample_rss(other, 1.0, lean)
    with pytest.raises(ValueError, match="in_sample_only=False"):
        token_residuals(lean, 1.0, torch.as_tensor(X[:5], dtype=F64), torch.as_tensor(cls[:5]))


def test_bt_columns_are_zero_for_classes_not_trained_on():
    X, cls, C = _problem(seed=2)
    fit = fit_moments(_moments(X, cls, C))
    cols = torch.tensor([C - 1, int(cls[0]), C - 2])
    got = fit.bt_columns(cols)
    assert torch.all(got[:, 0] == 0) and torch.all(got[:, 2] == 0)
    Xc = X - fit.mu.numpy()
    b = Xc[cls == cls[0]].sum(0)
    np.testing.assert_allclose(got[:, 1].numpy(), fit.Q.numpy().T @ b, rtol=1e-9, atol=1e-12)
