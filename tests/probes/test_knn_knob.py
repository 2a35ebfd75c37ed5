"""kNN sense probe and knob direction: planted senses and a planted direction are recovered."""

import numpy as np
import pytest
import torch

from probes.knn import KnnSenseProbe, knn_sense_accuracy
from probes.knob import KnobProbe


def _senses(n_groups=20, per_sense=6, n_senses=3, d=16, seed=0):
    rng = np.random.default_rng(seed)
    X0, X1, senses, groups = [], [], [], []
    for g in range(n_groups):
        centres = rng.normal(size=(n_senses, d)) * 3
        for s in range(n_senses):
            X0.append(rng.normal(size=(per_sense, d)))                       # no sense information
            X1.append(centres[s] + rng.normal(size=(per_sense, d)))          # planted sense clusters
            senses += [f"{g}.{s}"] * per_sense
            groups += [f"lemma{g}"] * per_sense
    return np.stack([np.vstack(X0), np.vstack(X1)]), np.array(senses), np.array(groups)


def test_knn_recovers_planted_senses():
    X, senses, groups = _senses()
    r = KnnSenseProbe(k=1).fit(torch.tensor(X), senses, groups).result_
    assert r.accuracy[1] > 0.95 and r.best_layer == 1
    assert abs(r.accuracy[0] - r.chance) < 0.1
    assert abs(r.chance - 5 / 17) < 1e-9            # (n_sense - 1) / (n_word - 1)
    assert r.most_frequent_sense == 0.0             # balanced senses: leaving one out never leaves it the majority
    assert r.group_accuracy.shape == (2, 20) and r.n_contexts == 360
    assert knn_sense_accuracy(X[1], senses, groups, k=3) > 0.95


def test_knn_skips_singletons_and_rejects_bad_input():
    X, senses, groups = _senses(n_groups=2)
    groups = groups.copy()
    groups[0] = "alone"
    r = KnnSenseProbe().fit(X, senses, groups).result_
    assert r.n_groups == 2 and r.n_contexts == len(groups) - 1
    with pytest.raises(ValueError, match="at least one group with 2"):
        KnnSenseProbe().fit(X, senses, np.arange(len(groups)))
    with pytest.raises(ValueError, match="senses: expected"):
        KnnSenseProbe().fit(X, senses[:-1], groups)
    with pytest.raises(ValueError, match="k: expected"):
        KnnSenseProbe(k=0).fit(X, senses, groups)


def test_knob_finds_planted_direction_at_its_layer():
    rng = np.random.default_rng(0)
    n, d, n_layers = 200, 32, 5
    y = np.repeat([0, 1], n // 2)
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    X = rng.normal(size=(n_layers, n, d))
    X[3] += np.outer(2.5 * (2 * y - 1), u)          # the knob lives in layer 3
    X[1] += np.outer(0.4 * (2 * y - 1), u)          # a weak echo in layer 1
    est = KnobProbe(n_folds=4).fit(X, np.where(y == 1, "context", "prior"))
    r = est.result_
    assert est.best_layer_ == 3 and r.separation[3] > 0.95 and r.logistic_accuracy[3] > 0.9
    assert r.separation[0] < 0.65 and r.separation[1] < r.separation[3]
    assert abs(est.direction_ @ u) > 0.9
    assert list(r.conditions) == ["context", "prior"]
    # condition 1 ("prior") sits on the negative side of u: the direction points from 0 to 1
    assert r.proj_mean[3, 1] > r.proj_mean[3, 0] and est.direction_ @ u < 0
    assert r.dprime[3] > 3 and r.cosine[3] > 0.5


def test_knob_bad_input():
    X = np.random.default_rng(0).normal(size=(2, 20, 4))
    with pytest.raises(ValueError, match="exactly 2 distinct"):
        KnobProbe().fit(X, np.arange(20) % 3)
    with pytest.raises(ValueError, match="at least n_folds"):
        KnobProbe(n_folds=5).fit(X, np.r_[np.zeros(17), np.ones(3)])
    with pytest.raises(ValueError, match="condition: expected 20"):
        KnobProbe().fit(X, np.zeros(19))


def test_knn_all_groups_at_once_equals_per_group_brute_force():
    """One neighbour graph per layer (all groups, same-group pairs only) gives each group's own
    leave-one-out vote; exact duplicate contexts are ordered by context, whatever the layout."""
    rng = np.random.default_rng(0)
    n, d = 300, 12
    groups = rng.integers(0, 25, n)
    senses = rng.integers(0, 3, n) + 10 * groups
    X = rng.normal(size=(n, d)) + (senses % 7)[:, None] * 0.3
    for k in (1, 3, 4):
        got = KnnSenseProbe(k=k).fit([X], senses, groups).result_
        want = []
        for g in got.groups:
            m = np.flatnonzero(groups == g)
            U = X[m] / np.linalg.norm(X[m], axis=1, keepdims=True)
            S = U @ U.T
            np.fill_diagonal(S, -np.inf)
            ok = []
            for i in range(len(m)):
                near = np.argsort(-S[i], kind="stable")[: min(k, len(m) - 1)]
                votes = senses[m][near]
                vals, counts = np.unique(votes, return_counts=True)
                winners = set(vals[counts == counts.max()])
                ok.append(next(v for v in votes if v in winners) == senses[m][i])
            want.append(np.mean(ok))
        np.testing.assert_allclose(got.group_accuracy[0], want)
    Xd = X.copy()
    Xd[:10] = Xd[10:20]  # duplicates: ties broken by context, so any relabelling of groups agrees
    a = KnnSenseProbe(k=3).fit([Xd], senses, groups).accuracy_
    b = KnnSenseProbe(k=3).fit([Xd], senses, groups + 1000).accuracy_
    assert a[0] == b[0]


def test_knn_ties_are_broken_in_expectation_not_by_order():
    """Equal cosines share the vote: a word whose contexts all have one state scores exactly the
    most-frequent-sense baseline, whatever order the contexts come in; a level pair scores 1/2."""
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(40), 6)
    senses = rng.integers(0, 3, size=groups.size) + 10 * groups
    static = rng.normal(size=(40, 16))[groups]  # one state per word: every neighbour ties
    res = KnnSenseProbe(k=1).fit([static], senses, groups).result_
    assert res.accuracy[0] == pytest.approx(res.most_frequent_sense, abs=1e-12)
    perm = rng.permutation(groups.size)
    again = KnnSenseProbe(k=3).fit([static[perm]], senses[perm], groups[perm]).result_
    first = KnnSenseProbe(k=3).fit([static], senses, groups).result_
    assert again.accuracy[0] == pytest.approx(first.accuracy[0], abs=1e-12)
    # context 0 (sense 0) has two equally near others, of sense 0 and of sense 1: right half the time;
    # context 1 is nearest context 0 (right), context 2 is nearest context 0 (wrong)
    X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, -1.0]])
    assert knn_sense_accuracy(X, np.array([0, 0, 1]), np.zeros(3, int), k=1) == pytest.approx((0.5 + 1 + 0) / 3)


def test_knn_on_one_thread_equals_the_pool(monkeypatch):
    """A small CPU search runs under lens.runtime.threads.serial; the accuracies are the pooled ones."""
    import probes.knn as knn
    from lens.runtime.threads import configure_threads

    configure_threads()
    X, senses, groups = _senses(n_groups=12, d=576)
    X = X + np.repeat(X[:, ::6], 6, axis=1) * 0.5  # nearer neighbours: more decisions at close cosines
    serial = KnnSenseProbe(k=3).fit(torch.tensor(X), senses, groups).result_
    monkeypatch.setattr(knn, "_SERIAL_WORK", -1)   # everything pooled
    pooled = KnnSenseProbe(k=3).fit(torch.tensor(X), senses, groups).result_
    assert np.array_equal(serial.group_accuracy, pooled.group_accuracy)
    assert np.array_equal(serial.accuracy, pooled.accuracy)


def test_knob_without_the_logistic_probe_finds_the_same_knob():
    """``logistic=False`` (the nested refits of the context knob) skips only the logistic probe: the best layer,
    the directions, the projection means, separation and d' are those of the full fit."""
    rng = np.random.default_rng(5)
    y = np.repeat([0, 1], 20)
    X = rng.normal(size=(4, 40, 12))
    X[2, :, 3] += 2.5 * y
    full = KnobProbe(n_folds=4, seed=1).fit(X, y).result_
    lean = KnobProbe(n_folds=4, seed=1, logistic=False).fit(X, y).result_
    assert lean.best_layer == full.best_layer == 2
    for name in ("separation", "dprime", "direction", "proj_mean"):
        np.testing.assert_array_equal(getattr(lean, name), getattr(full, name), err_msg=name)
    assert np.isnan(lean.logistic_accuracy).all() and np.isnan(lean.cosine).all()
