"""The null of the sequence-level ID hunchback (geometry.id_hunchback.label_permutation_null): its add-one
p-value is small when the real cloud has a hunchback its control lacks, and about uniform when real and
control come from one distribution (structureless: nothing tells them apart)."""

import numpy as np
import pytest

from geometry import TwoNN
from geometry.id_hunchback import (hunchback_statistic, id_profile, label_permutation_null, twonn_dimension,
                                   twonn_ratios)
from studies.core.stability import add_one_p
from tests.geometry.layer_clouds import drifting_layers


def _layers(dims, n, rng, D=16, drift=0.5):
    return drifting_layers(dims, n, rng, D, drift)


def test_ratios_and_estimate_match_the_library_twonn():
    rng = np.random.default_rng(0)
    X = _layers((5,), 400, rng, D=30)[0]
    assert twonn_dimension(twonn_ratios(X)) == pytest.approx(TwoNN().fit(X).dimension_, rel=1e-9)
    assert twonn_dimension(twonn_ratios(X)) == pytest.approx(5, rel=0.15)


def test_a_duplicate_point_is_dropped_as_the_library_twonn_drops_it():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 4))
    X[7] = X[3]
    mu = twonn_ratios(X)
    assert np.isnan(mu[7]) and np.isfinite(np.delete(mu, [7])).all()  # the first copy is kept
    assert twonn_dimension(mu) == pytest.approx(TwoNN().fit(X).dimension_, rel=1e-9)


def test_the_observed_difference_is_the_two_clouds_statistics():
    rng = np.random.default_rng(2)
    real, control = _layers((2, 5, 8, 5, 3), 120, rng), _layers((4, 4, 4, 4, 4), 100, rng)
    observed, null = label_permutation_null(real, control, n_perm=9, seed=0)
    want = hunchback_statistic(id_profile(real)[0])[0] - hunchback_statistic(id_profile(control)[0])[0]
    assert observed == pytest.approx(want, rel=1e-9) and null.shape == (9,)
    # the answer does not depend on how many pooled neighbours are searched first
    again, null_again = label_permutation_null(real, control, n_perm=9, seed=0, k_pool=2)
    assert again == pytest.approx(observed, rel=1e-9) and np.allclose(null_again, null)


def test_p_is_small_on_structured_data():
    """A hunchback in the real cloud, a flat control (what shuffled text gives, Cheng et al. 2025)."""
    rng = np.random.default_rng(3)
    real, control = _layers((3, 6, 10, 6, 4), 150, rng), _layers((4, 4, 4, 4, 4), 150, rng)
    observed, null = label_permutation_null(real, control, n_perm=49, seed=1)
    assert add_one_p(observed, null, greater=True) == pytest.approx(1 / 50)


def test_p_is_about_uniform_on_structureless_data():
    """Real and control drawn from one distribution: the labels are exchangeable and p is uniform on
    {1/40, ..., 1} (checked loosely over 30 draws: its mean near 1/2, few small values)."""
    rng = np.random.default_rng(4)
    ps = []
    for i in range(30):
        real, control = _layers((3, 5, 7, 5, 3), 50, rng), _layers((3, 5, 7, 5, 3), 50, rng)
        observed, null = label_permutation_null(real, control, n_perm=39, seed=i)
        ps.append(add_one_p(observed, null, greater=True))
    ps = np.array(ps)
    assert 0.35 < ps.mean() < 0.65, ps
    assert (ps <= 0.1).mean() <= 0.25, ps


def test_bad_input():
    rng = np.random.default_rng(5)
    real = _layers((2, 3, 2), 20, rng)
    with pytest.raises(ValueError, match="same layers"):
        label_permutation_null(real, real[:2])
    with pytest.raises(ValueError, match="at least 3 sequences"):
        label_permutation_null(real, [x[:2] for x in real])
