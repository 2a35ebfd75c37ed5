"""Known answers and scikit-learn equality for the closed-form prediction residual."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from probes._common import final_norm
from probes.pr_law import pr_law_summary
from probes.prediction_residual import PredictionResidual, prediction_residual
from probes.synthetic import equal_gain_states


@pytest.fixture(scope="module")
def equal_gain():
    return equal_gain_states(n_tokens=20000, n_layers=8, d_model=32, n_classes=16, pr0=0.9, decay=0.7)


def test_equal_gain_law_recovered(equal_gain):
    X, y, docs, expected = equal_gain
    est = PredictionResidual(norm=None, n_boot=200).fit(X, y, docs)
    r = est.result_
    np.testing.assert_allclose(r.pr, expected, rtol=0.03)
    assert r.summary.pearson_r < -0.999
    assert abs(r.summary.decay_ratio - 0.7) < 0.01
    np.testing.assert_allclose(r.summary.gain_share[1:], 1 / 7, atol=0.02)
    assert np.all(r.pr_low <= r.pr) and np.all(r.pr <= r.pr_high)
    assert r.slope_interval[0] <= r.summary.slope_log10 <= r.slope_interval[1]
    np.testing.assert_allclose(r.pr_in_sample, expected, rtol=0.03)
    assert r.val_pr.shape == (8, len(r.alphas_relative))
    assert est.pr_ is r.pr and est.alpha_.shape == (8,)
    assert set(est.train_docs_) | set(est.val_docs_) | set(est.test_docs_) == set(np.unique(docs.numpy()))


def test_pr_falls_with_signal_under_rms_norm(equal_gain):
    X, y, docs, _ = equal_gain
    r = PredictionResidual(norm="rms", n_boot=0).fit(X, y, docs).result_
    assert np.all(np.diff(r.pr) < 0)
    assert r.summary.pearson_r < -0.99
    assert np.all(np.isnan(r.pr_low))


def _small_problem(seed=0, n=600, d=8, v=30, n_docs=30):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, v, n)
    X = rng.normal(size=(n, d)) + 2.0 * np.eye(v)[y][:, :d] + 3.0   # an offset: the intercept matters
    docs = np.repeat(np.arange(n_docs), n // n_docs)
    return X, y, docs, v


def _sk_pr(X, Y, alpha, fit_rows, score_rows):
    P = Ridge(alpha=alpha).fit(X[fit_rows], Y[fit_rows]).predict(X[score_rows]).reshape(score_rows.sum(), -1)
    Ys = Y[score_rows].reshape(score_rows.sum(), -1)
    return ((Ys - P) ** 2).sum() / ((Ys - Ys.mean(0)) ** 2).sum()


@pytest.mark.parametrize("norm", ["rms", "layer", None])
def test_equals_sklearn_ridge(norm):
    X, y, docs, v = _small_problem()
    est = PredictionResidual(norm=norm, n_boot=0, in_sample_alpha=1e-3).fit(torch.tensor(X[None]), y, docs)
    # an independent numpy version of the fresh final norm
    if norm == "rms":
        Xn = X / np.sqrt((X ** 2).mean(1, keepdims=True) + 1e-5)
    elif norm == "layer":
        Xc = X - X.mean(1, keepdims=True)
        Xn = Xc / np.sqrt((Xc ** 2).mean(1, keepdims=True) + 1e-5)
    else:
        Xn = X
    Y = np.eye(v)[y]
    tr, va, te = (np.isin(docs, d) for d in (est.train_docs_, est.val_docs_, est.test_docs_))
    # held-out: refit on train + validation with the chosen alpha, score test documents
    assert abs(_sk_pr(Xn, Y, est.alpha_[0], tr | va, te) - est.pr_[0]) < 1e-4
    # the validation curve over the grid
    Xtr = Xn[tr] - Xn[tr].mean(0)
    scale = np.trace(Xtr.T @ Xtr) / X.shape[1]
    sk_val = [_sk_pr(Xn, Y, a * scale, tr, va) for a in est.result_.alphas_relative]
    np.testing.assert_allclose(est.val_pr_[0], sk_val, atol=1e-4)
    # in-sample and token-id variants: fit and score on all tokens
    Xa = Xn - Xn.mean(0)
    lam_all = est.in_sample_alpha * np.trace(Xa.T @ Xa) / X.shape[1]
    every = np.ones(len(y), bool)
    assert abs(_sk_pr(Xn, Y, lam_all, every, every) - est.pr_in_sample_[0]) < 1e-4
    assert abs(_sk_pr(Xn, y.astype(float), lam_all, every, every) - est.pr_token_id_[0]) < 1e-4


def test_final_norm_matches_torch_modules():
    x = torch.randn(50, 16, dtype=torch.float64) * 3 + 1
    rms = torch.nn.RMSNorm(16, eps=1e-5, dtype=torch.float64)
    ln = torch.nn.LayerNorm(16, eps=1e-5, dtype=torch.float64)
    torch.testing.assert_close(final_norm(x, "rms"), rms(x).detach())
    torch.testing.assert_close(final_norm(x, "layer"), ln(x).detach())
    with pytest.raises(ValueError, match="norm"):
        final_norm(x, "batch")


def test_input_forms_agree_and_end_of_document_dropped():
    X, y, docs, _ = _small_problem(seed=1)
    base = PredictionResidual(n_boot=20).fit([X, 2 * X], y, docs).result_
    as3d = PredictionResidual(n_boot=20).fit(torch.tensor(np.stack([X, 2 * X])), y, docs).result_
    np.testing.assert_allclose(base.pr, as3d.pr, rtol=1e-10)
    np.testing.assert_allclose(base.pr_low, as3d.pr_low, rtol=1e-10)
    half = PredictionResidual(n_boot=0).fit([torch.tensor(X, dtype=torch.float16)], y, docs).result_
    assert abs(half.pr[0] - base.pr[0]) < 1e-2
    # -1 (no next token) rows are dropped, as if absent
    y2, X2, d2 = np.append(y, [-1, -1]), np.vstack([X, X[:2]]), np.append(docs, [0, 1])
    with_end = PredictionResidual(n_boot=0).fit([X2], y2, d2).result_
    assert abs(with_end.pr[0] - base.pr[0]) < 1e-10
    one = prediction_residual(X, y, docs, n_boot=0)
    assert abs(one.pr - base.pr[0]) < 1e-10 and one.layer == 0


def test_pr_law_summary_exact():
    s = pr_law_summary(np.arange(5), 0.8 * 0.5 ** np.arange(5))
    assert abs(s.decay_ratio - 0.5) < 1e-12 and abs(s.pearson_r + 1) < 1e-12
    np.testing.assert_allclose(s.gain_share[1:], 0.25)
    assert np.isnan(pr_law_summary([0], [0.5]).slope_log10)
    with pytest.raises(ValueError, match="equal lengths"):
        pr_law_summary([0, 1], [0.5])


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda X, y, d: (X, y, np.zeros_like(d)), "at least 3 distinct documents"),
        (lambda X, y, d: (X[:, :4], y[:4], d[:4] * 0 + np.arange(4)), "at least 2 train"),
        (lambda X, y, d: (X, y[:-1], d), "next_ids: expected 600"),
        (lambda X, y, d: (X, y, d[:-1]), "docs: expected 600"),
        (lambda X, y, d: ([X[0], X[1][:-1]], y, d), r"X\[1\]: expected 600 tokens"),
        (lambda X, y, d: (np.where(np.arange(600)[None, :, None] == 7, np.nan, X), y, d), "NaN"),
        (lambda X, y, d: (X, y.astype(float), d), "integer token ids"),
        (lambda X, y, d: (X, y - 5, d), "-1 for none"),
        (lambda X, y, d: (X[0], y, d), "3-D"),
        (lambda X, y, d: (X, y * 0, d), "2 distinct next tokens"),
    ],
)
def test_bad_input(mutate, match):
    X, y, docs, _ = _small_problem()
    X = np.stack([X, X])
    Xb, yb, db = mutate(X, y, docs)
    with pytest.raises(ValueError, match=match):
        PredictionResidual(n_boot=0).fit(Xb, yb, db)


@pytest.mark.parametrize("params, match", [({"alphas": [-1.0]}, "alphas"), ({"norm": "batch"}, "norm"),
                                            ({"val_fraction": 0.6, "test_fraction": 0.5}, "sum below 1"),
                                            ({"confidence": 1.5}, "confidence")])
def test_bad_params(params, match):
    X, y, docs, _ = _small_problem()
    with pytest.raises(ValueError, match=match):
        PredictionResidual(**params).fit([X], y, docs)


def test_bootstrap_interval_centred_without_signal():
    # PR near 1 with many rare classes: re-centring replicates at their own mean would push the
    # whole interval above the estimate; the per-document ratio of sums must not
    from probes.synthetic import ZipfStates

    data = ZipfStates(n_tokens=6000, n_layers=1, d_model=16, vocab=800, tokens_per_doc=100, seed=3)
    r = PredictionResidual(n_boot=300).fit(data, data.next_ids, data.docs).result_
    assert r.pr_low[0] < r.pr[0] < r.pr_high[0]
    assert abs(np.median(r.boot_pr[:, 0]) - r.pr[0]) < 0.25 * (r.pr_high[0] - r.pr_low[0])
