"""Linearity known answers: an exactly linear chain scores 1, a planted nonlinearity dips there."""

from collections.abc import Sequence

import numpy as np
import pytest
import torch

import geometry


def chain(n=600, d=32, layers=6, nonlinear_at=None, seed=0):
    rng = np.random.default_rng(seed)
    H = [rng.normal(size=(n, d))]
    for layer in range(layers - 1):
        W = rng.normal(size=(d, d)) / np.sqrt(d)
        Y = H[-1] @ W + rng.normal(size=d)  # affine: the bias is removed by centring
        if layer == nonlinear_at:
            Y = np.tanh(2.0 * Y)
        H.append(Y)
    return H


def test_exactly_linear_chain_scores_one():
    prof = geometry.linearity_profile(chain())
    np.testing.assert_allclose(prof.linearity, 1.0, atol=1e-9)
    np.testing.assert_allclose(prof.linearity_centered, 1.0, atol=1e-9)
    np.testing.assert_allclose(prof.nonlinearity, 0.0, atol=1e-6)


def test_planted_nonlinearity_dips_at_its_layer():
    prof = geometry.linearity_profile(chain(nonlinear_at=2), layers=[10, 11, 12, 13, 14, 15])
    assert int(np.argmin(prof.linearity)) == 2
    assert prof.source_layers.tolist() == [10, 11, 12, 13, 14]
    assert prof.linearity[2] < 0.95
    others = np.delete(prof.linearity, 2)
    np.testing.assert_allclose(others, 1.0, atol=1e-9)
    assert int(np.argmax(prof.nonlinearity_mean)) == 2
    # mean squared per-token nonlinearity equals 1 - linearity (module convention)
    assert np.mean(prof.nonlinearity[2] ** 2) == pytest.approx(1 - prof.linearity[2], rel=1e-9)


def test_score_is_scale_and_shift_invariant_and_accepts_torch():
    H = chain(nonlinear_at=0, layers=2)
    s = geometry.linearity_score(H[0], H[1])
    assert geometry.linearity_score(5 * H[0] + 2, 0.1 * H[1] - 7) == pytest.approx(s, abs=1e-10)
    t = geometry.linearity_score(torch.tensor(H[0], dtype=torch.float32), torch.tensor(H[1]))
    assert t == pytest.approx(s, abs=1e-5)
    tok = geometry.token_nonlinearity(H[0], H[1])
    assert tok.shape == (600,)


def test_aggregation_by_token_and_group():
    values = np.array([[1.0, 2.0, 3.0, 5.0], [0.0, 0.0, 1.0, 1.0]])
    tokens = np.array(["Ġthe", ",", "Ġthe", "Ġcat"])
    by_tok = geometry.aggregate_by_token(values, tokens)
    assert by_tok.keys.tolist() == [",", "Ġcat", "Ġthe"]
    np.testing.assert_allclose(by_tok.mean, [[2.0, 5.0, 2.0], [0.0, 1.0, 0.5]])
    classes = np.array(["determiner", "punctuation", "determiner", "content"])
    by_cls = geometry.group_means(values[0], classes, order=("punctuation", "determiner", "stopword", "content"))
    assert by_cls.keys.tolist() == ["punctuation", "determiner", "content"]  # the given order, those present
    np.testing.assert_allclose(by_cls.mean, [2.0, 2.0, 5.0])
    assert by_cls.count.tolist() == [1, 2, 1]
    assert geometry.aggregate_by_token(values, tokens, min_count=2).keys.tolist() == ["Ġthe"]


def test_linearity_bad_input():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"more tokens than dimensions .* n_tokens=20, d=32"):
        geometry.linearity_score(rng.normal(size=(20, 32)), rng.normal(size=(20, 32)))
    assert 0 < geometry.linearity_score(rng.normal(size=(20, 32)), rng.normal(size=(20, 32)), ridge=1e-2) < 1
    with pytest.raises(ValueError, match="same tokens"):
        geometry.linearity_score(rng.normal(size=(50, 3)), rng.normal(size=(40, 3)))
    with pytest.raises(ValueError, match="at least 2 layers"):
        geometry.linearity_profile([rng.normal(size=(50, 3))])
    with pytest.raises(ValueError, match="NaN or inf"):
        X = rng.normal(size=(50, 3))
        X[4, 1] = np.inf
        geometry.linearity_score(X, X)


@pytest.mark.parametrize("degenerate", [False, True])
def test_least_squares_residual_equals_lapack(degenerate, monkeypatch):
    """The Gram-eigendecomposition solve gives LAPACK's residuals: states with a rogue dimension 100x the
    rest (against the rank-revealing QR, gelsy, used before), and with a constant and a duplicated column
    (against the SVD solver, gelsd: there gelsy's per-token residuals differ from gelsd's and pinv's
    by 5e-3 at the same total, keeping a round-off direction of the centred constant column)."""
    from geometry import linearity
    from geometry.linearity import _LeastSquares, normalize_frobenius

    monkeypatch.setattr(linearity, "ROW_CHUNK", 700)  # the residual formed in 5 chunks of rows

    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 48))
    X[:, 5] *= 100.0
    if degenerate:
        X[:, 7] = 1.5
        X[:, 9] = X[:, 10]
    Y = np.tanh(X @ rng.normal(size=(48, 48)) / 10) + 0.1 * rng.normal(size=(3000, 48))
    Xn = normalize_frobenius(torch.tensor(X))
    Yn = normalize_frobenius(torch.tensor(Y))
    ref = Xn @ torch.linalg.lstsq(Xn, Yn, driver="gelsd" if degenerate else "gelsy").solution - Yn
    got = _LeastSquares(Xn, 0.0).residual_norms(Yn)  # per token, formed a chunk of rows at a time
    assert torch.allclose(got, torch.linalg.vector_norm(ref, dim=1), atol=1e-10, rtol=0)
    assert float((got * got).sum()) == pytest.approx(float((ref * ref).sum()), abs=1e-12)


class _CountingLayers(Sequence):
    """A lazy layer sequence that counts its reads (like a store's layer view)."""

    def __init__(self, mats):
        self.mats, self.reads = mats, 0

    def __len__(self):
        return len(self.mats)

    def __getitem__(self, i):
        self.reads += 1
        return self.mats[i]


@pytest.mark.parametrize("ridge", [0.0, 1e-3])
def test_profile_equals_the_pairwise_scores(ridge):
    """The profile's scores are those of ``linearity_score`` / ``token_nonlinearity`` per transition;
    the centred one, derived from the plain residual without ridge, to float64 rounding. A lazy
    sequence is read once per layer."""
    H = chain(n=400, d=24, layers=4, nonlinear_at=1)
    H[2] = H[2] + 0.3 * np.tanh(H[1] @ np.ones((24, 24)) / 24)
    lazy = _CountingLayers(H)
    prof = geometry.linearity_profile(lazy, ridge=ridge)
    assert lazy.reads == 4
    for p in range(3):
        assert prof.linearity[p] == geometry.linearity_score(H[p], H[p + 1], ridge=ridge)
        np.testing.assert_array_equal(prof.nonlinearity[p], geometry.token_nonlinearity(H[p], H[p + 1], ridge=ridge))
        want = geometry.linearity_score(H[p], H[p + 1] - H[p], ridge=ridge)
        if ridge:
            assert prof.linearity_centered[p] == want
        else:
            assert prof.linearity_centered[p] == pytest.approx(want, rel=1e-12, abs=1e-14)


def test_profile_centred_score_with_a_dropped_direction_is_regressed_explicitly():
    """A constant column leaves a direction the least-squares map drops: X̃ is not reproduced
    exactly, and the centred score comes from the explicit fit of the update."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 6))
    X[:, 2] = 4.0
    Y = np.tanh(X @ rng.normal(size=(6, 6)))
    prof = geometry.linearity_profile([X, Y])
    assert prof.linearity_centered[0] == geometry.linearity_score(X, Y - X)
    assert prof.linearity[0] == geometry.linearity_score(X, Y)


def test_profile_bad_input_names_the_layer():
    rng = np.random.default_rng(0)
    good = rng.normal(size=(50, 3))
    bad = good.copy()
    bad[7, 0] = np.nan
    with pytest.raises(ValueError, match=r"states\[12\] must hold only finite values.*rows \[7\]"):
        geometry.linearity_profile([good, bad], layers=[11, 12])
    with pytest.raises(ValueError, match="same tokens"):
        geometry.linearity_profile([good, good[:40]])
    with pytest.raises(ValueError, match="ridge must be >= 0"):
        geometry.linearity_profile([good, good], ridge=-1.0)
    with pytest.raises(ValueError, match="zero variance"):
        geometry.linearity_profile([good, good])  # no update: the centred score is undefined


def test_nonlinearity_profile_is_token_nonlinearity_per_transition():
    H = chain(n=300, d=16, layers=4, nonlinear_at=1)
    lazy = _CountingLayers([torch.tensor(h) for h in H])
    got = geometry.linearity.nonlinearity_profile(lazy, ridge=0.0)
    assert got.shape == (3, 300) and lazy.reads == 4
    for p in range(3):
        np.testing.assert_array_equal(got[p], geometry.token_nonlinearity(H[p], H[p + 1]))
    np.testing.assert_array_equal(got, geometry.linearity_profile(H).nonlinearity)
    with pytest.raises(ValueError, match="at least 2 layers"):
        geometry.linearity.nonlinearity_profile(H[:1])


@pytest.mark.parametrize("ridge", [0.0, 0.01])
def test_profile_subsets_equal_a_refit_on_those_rows(ridge):
    """linearity_profile(subsets=...) refits each row subset in the profile's one pass: the same scores as
    linearity_scores on those rows alone (float64 rounding), NaN where a least-squares map cannot be fitted,
    and the profile itself unchanged."""
    rng = np.random.default_rng(3)
    n, d = 600, 12
    states = [rng.normal(size=(n, d))]
    for _ in range(3):
        states.append(np.tanh(states[-1] @ rng.normal(size=(d, d)) / 3) + states[-1] + 0.1 * rng.normal(size=(n, d)))
    states = [s.astype(np.float32) for s in states]
    for s in states:  # a few sink-like outlier rows, far from the rest
        s[::50] = s[::50] * 40 + 20
    quarter = rng.random(n) < 0.25
    half = quarter | (rng.random(n) < 0.33)
    free = np.ones(n, bool)
    free[::50] = False
    tiny = np.zeros(n, bool)
    tiny[:d] = True  # d rows: no more rows than dimensions
    prof = geometry.linearity_profile(states, ridge=ridge, subsets=[quarter, half, free, tiny])
    plain = geometry.linearity_profile(states, ridge=ridge)
    np.testing.assert_allclose(prof.linearity, plain.linearity, rtol=0, atol=1e-12)
    np.testing.assert_allclose(prof.nonlinearity, plain.nonlinearity, rtol=0, atol=1e-10)
    for k, mask in enumerate([quarter, half, free]):
        want = geometry.linearity.linearity_scores([s[mask] for s in states], ridge=ridge)
        np.testing.assert_allclose(prof.subset_linearity[k], want, rtol=0, atol=1e-12)
    if ridge == 0:
        assert np.isnan(prof.subset_linearity[3]).all()
    else:
        want = geometry.linearity.linearity_scores([s[tiny] for s in states], ridge=ridge)
        np.testing.assert_allclose(prof.subset_linearity[3], want, rtol=0, atol=1e-12)
    assert plain.subset_linearity is None
