"""Nulls, resampling and the corrected participation ratio of the geometry numbers a claim is judged on
(issue #37): known answers, the nulls' p-values small on structured data and roughly uniform on structureless
data, and the closed forms against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from geometry import linearity_score, mean_cosine, nulls
from geometry.participation import participation_from_sums, participation_ratio, participation_ratios, spectral_sums
from studies.core.stability import add_one_p


# ---------------------------------------------------------------------------- participation ratio
def test_the_corrected_participation_ratio_equals_the_brute_force_u_statistics():
    """(tr Σ)² and tr Σ² as averages over distinct quadruples of pair differences, by brute force."""
    rng = np.random.default_rng(0)
    n, d = 7, 3
    X = rng.standard_normal((n, d)) * [1.0, 2.0, 3.0] + 5.0
    sq = tr2 = 0.0
    for i, j, l, r in itertools.permutations(range(n), 4):
        a, c = X[i] - X[j], X[l] - X[r]
        tr2 += (a @ c) ** 2 / 4
        sq += (a @ a) * (c @ c) / 4
    quads = n * (n - 1) * (n - 2) * (n - 3)
    _, corrected = participation_ratios(X)
    assert corrected == pytest.approx((sq / quads) / (tr2 / quads), rel=1e-10)


@pytest.mark.parametrize("n", [100, 200])
def test_an_isotropic_gaussian_with_n_near_d_plain_pr_is_biased_low_and_corrected_is_d(n):
    d = 100
    rng = np.random.default_rng(1)
    plain, corrected = np.mean([participation_ratios(rng.standard_normal((n, d)).astype(np.float32))
                                for _ in range(5)], axis=0)
    # 1/PR ≈ 1/n + 1/d (Chun et al.): about 50 at n = d, 67 at n = 2d
    assert plain == pytest.approx(1 / (1 / n + 1 / d), rel=0.08)
    assert plain < 0.7 * d
    assert corrected == pytest.approx(d, rel=0.08)


def test_the_corrected_pr_finds_a_low_dimensional_cloud_and_ignores_its_offset():
    rng = np.random.default_rng(2)
    k, d, n = 8, 64, 60
    X = rng.standard_normal((n, k)) @ np.linalg.qr(rng.standard_normal((d, k)))[0].T + 100.0
    plain, corrected = participation_ratios(X)
    assert plain < k and corrected == pytest.approx(k, rel=0.25)
    assert participation_ratio(X) == plain and participation_ratio(X, corrected=True) == corrected


def test_participation_sums_refuse_what_they_cannot_measure():
    with pytest.raises(ValueError, match="at least 4 rows"):
        spectral_sums(np.ones((3, 2)))
    assert np.isnan(participation_from_sums(4, 0.0, 0.0, 0.0)[0])


# ---------------------------------------------------------------------------- mean cosine, its null, its bootstrap
def test_mean_cosine_from_unit_sums_matches_the_direct_one_and_unit_weights_of_one():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((300, 16)) + 0.7
    units = np.repeat(np.arange(30), 10)
    S, m, var = nulls.unit_sums(X, units)
    assert S.shape == (30, 16) and m.sum() == 300
    assert nulls.mean_cosine_of(S, m) == pytest.approx(mean_cosine(X), rel=1e-10)
    assert nulls.mean_cosine_of(S, m, np.ones((2, 30)))[0] == pytest.approx(mean_cosine(X), rel=1e-10)
    assert var == pytest.approx(X.var(axis=0, ddof=1), rel=1e-10)
    # a unit drawn twice: its own pairs count twice, its copies do not pair with each other
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    C = U @ U.T
    w = np.zeros(30)
    w[0], w[1] = 2, 1
    within0 = C[:10, :10].sum() - 10
    within1 = C[10:20, 10:20].sum() - 10
    between = 2 * C[:10, 10:20].sum() * 2  # both orders, unit 0's two copies
    want = (2 * within0 + within1 + between) / (2 * 90 + 90 + 2 * 2 * 100)
    assert nulls.mean_cosine_of(S, m, w[None])[0] == pytest.approx(want, rel=1e-10)


def _null_p(X, units, seed):
    S, m, var = nulls.unit_sums(X, units)
    null = nulls.null_mean_cosine(nulls.isotropic_null_draws(var, 199, seed=seed), m.sum())
    return add_one_p(nulls.mean_cosine_of(S, m), null), null


def test_the_isotropic_null_is_roughly_uniform_on_an_isotropic_cloud_and_small_on_a_cone():
    rng = np.random.default_rng(4)
    scales = np.linspace(0.3, 3.0, 24)  # unequal spreads: kept by the null, no anisotropy in the paper's sense
    ps = [_null_p(rng.standard_normal((400, 24)) * scales, np.arange(400), s)[0] for s in range(60)]
    assert 0.35 < np.mean(ps) < 0.65
    assert np.mean(np.asarray(ps) <= 0.05) <= 0.15
    p, null = _null_p(rng.standard_normal((400, 24)) * scales + 0.5, np.arange(400), 0)  # a shared direction
    assert p == pytest.approx(1 / 200) and abs(float(np.mean(null))) < 0.01


def test_the_null_quantile_shrinks_with_the_number_of_tokens():
    draws = nulls.isotropic_null_draws(np.ones(32), 999, seed=0)
    q = [np.quantile(nulls.null_mean_cosine(draws, n), 0.975) for n in (100, 1000, 10000)]
    assert q[0] > q[1] > q[2] > 0
    assert q[0] / q[1] == pytest.approx(999 / 99, rel=1e-9)


def test_the_isotropic_null_refuses_degenerate_variances():
    with pytest.raises(ValueError, match="variances"):
        nulls.isotropic_null_draws(np.zeros(4))
    with pytest.raises(ValueError, match="variances"):
        nulls.isotropic_null_draws(np.array([1.0, np.nan]))


def test_the_bootstrap_interval_holds_the_mean_cosine_and_widens_with_fewer_units():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((2000, 16)) + rng.standard_normal((200, 16)).repeat(10, axis=0) * 0.5 + 0.3
    widths = []
    for n_units in (200, 20):
        units = np.arange(2000) // (2000 // n_units)
        S, m, _ = nulls.unit_sums(X, units)
        lo, hi = nulls.percentile_interval(nulls.bootstrap_mean_cosine(S, m, nulls.bootstrap_weights(n_units, 500)))
        assert lo <= nulls.mean_cosine_of(S, m) <= hi
        widths.append(hi - lo)
    assert widths[1] > widths[0]


# ---------------------------------------------------------------------------- linearity: permuted pairings
def test_permuted_pairing_scores_equal_the_score_of_the_permuted_target():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((120, 10))
    Y = X @ rng.standard_normal((10, 12)) + rng.standard_normal((120, 12))
    got = nulls.permuted_pairing_scores(X, Y, 3, seed=7)
    perm_rng = np.random.default_rng(7)
    want = [linearity_score(X, Y[perm_rng.permutation(120)]) for _ in range(3)]
    assert got == pytest.approx(want, abs=1e-9)
    got = nulls.permuted_pairing_scores(X, Y, 2, seed=7, ridge=0.05)
    perm_rng = np.random.default_rng(7)
    assert got == pytest.approx([linearity_score(X, Y[perm_rng.permutation(120)], ridge=0.05) for _ in range(2)],
                                abs=1e-9)


def test_the_permuted_pairing_null_is_small_on_a_linear_map_and_roughly_uniform_on_unrelated_layers():
    rng = np.random.default_rng(8)
    n, d = 150, 8
    X = rng.standard_normal((n, d))
    Y = X @ rng.standard_normal((d, d)) + 0.3 * rng.standard_normal((n, d))
    null = nulls.permuted_pairing_scores(X, Y, 19, seed=0)
    assert add_one_p(linearity_score(X, Y), null) == pytest.approx(0.05)
    assert np.mean(null) == pytest.approx(d / (n - 1), rel=0.3)  # a random pairing's share in the span
    ps = []
    for s in range(30):
        X, Y = rng.standard_normal((n, d)), rng.standard_normal((n, d))
        ps.append(add_one_p(linearity_score(X, Y), nulls.permuted_pairing_scores(X, Y, 19, seed=s)))
    assert 0.3 < np.mean(ps) < 0.7


def test_the_fixed_map_bootstrap_of_the_score():
    R = np.array([[0.01, 0.02, 0.03], [0.1, 0.0, 0.1]])
    T = np.array([[0.3, 0.3, 0.4], [0.5, 0.2, 0.3]])
    out = nulls.bootstrap_ratio(R, T, np.ones((4, 3)))
    assert out.shape == (4, 2)
    assert out[0] == pytest.approx([1 - 0.06, 1 - 0.2])
    w = np.array([[2.0, 0.0, 1.0]])
    assert nulls.bootstrap_ratio(R, T, w)[0, 0] == pytest.approx(1 - 0.05 / 1.0)


@pytest.mark.parametrize("ridge", [0.0, 0.01])
def test_the_score_only_path_equals_the_profile(ridge):
    from geometry import linearity_profile
    from geometry.linearity import linearity_scores

    rng = np.random.default_rng(9)
    H = [rng.standard_normal((90, 12))]
    for _ in range(3):
        H.append(np.tanh(H[-1] @ rng.standard_normal((12, 12)) * 0.5) + H[-1] + 5.0)
    want = linearity_profile(H, ridge=ridge).linearity
    assert linearity_scores(H, ridge=ridge) == pytest.approx(want, abs=1e-10)
