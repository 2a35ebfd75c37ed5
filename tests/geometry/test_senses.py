"""Known answers for sense clustering and sense dictionaries: planted clusters are recovered."""

from __future__ import annotations

import numpy as np
import pytest

from geometry.senses import SenseDict, agglomerative, kmeans, pca_2d, sense_clustering


def planted(n_words=6, n_senses=3, per_sense=5, d=48, spread=0.15, seed=0):
    """Layer 0: noise; layer 1: each word's senses are tight clusters around random directions;
    layer 2: the same with one rogue dimension of huge variance."""
    rng = np.random.default_rng(seed)
    X0, X1, senses, groups = [], [], [], []
    for w in range(n_words):
        centers = rng.normal(size=(n_senses, d))
        for s in range(n_senses):
            for _ in range(per_sense):
                X0.append(rng.normal(size=d))
                X1.append(centers[s] + spread * rng.normal(size=d))
                senses.append(f"w{w}.s{s}")
                groups.append(f"w{w}")
    X1 = np.array(X1)
    X2 = X1.copy()
    X2[:, 0] = 100.0 * rng.normal(size=len(X2))  # a rogue, high-variance dimension dominates cosine
    return np.stack([np.array(X0), X1, X2]), np.array(senses), np.array(groups)


def test_planted_clusters_recovered_per_layer():
    X, s, g = planted()
    res = sense_clustering(X, s, g, n_chance=20)
    assert res.ari.shape == (2, 3)
    assert np.all(res.ari[:, 1] > 0.95)  # both k-means and Ward recover the planted senses
    assert np.all(np.abs(res.ari[:, 0]) < 0.3)  # noise layer: near chance
    assert abs(res.chance) < 0.1 and res.most_frequent_sense == 0.0
    assert list(res.words) == [f"w{i}" for i in range(6)]


def test_rogue_dimension_hides_senses_and_standardising_restores_them():
    X, s, g = planted()
    raw = sense_clustering(X, s, g, n_chance=5)
    std = sense_clustering(X, s, g, postprocessing="standardize", n_chance=5)
    assert raw.ari[:, 2].max() < 0.6  # clusters follow the rogue dimension
    assert np.all(std.ari[:, 2] > 0.9)


def test_clusterers_and_pca():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0, 0.1, (10, 5)), rng.normal(5, 0.1, (10, 5))])
    truth = np.repeat([0, 1], 10)
    for lab in (kmeans(x, 2), agglomerative(x, 2)):
        assert len(set(zip(lab, truth))) == 2
    p = pca_2d(x)
    assert p.shape == (20, 2) and abs(p[:10, 0].mean() - p[10:, 0].mean()) > 5
    with pytest.raises(ValueError, match="k"):
        kmeans(x, 30)


def test_bad_input():
    X, s, g = planted(n_words=2)
    with pytest.raises(ValueError, match="methods"):
        sense_clustering(X, s, g, methods=("dbscan",))
    with pytest.raises(ValueError, match="equal lengths"):
        sense_clustering(X, s, g[:-1])
    with pytest.raises(ValueError, match="2\\+ senses"):
        sense_clustering(X, np.zeros(len(s)), g)


def test_sense_dict_recovers_planted_senses_and_round_trips(tmp_path):
    X, s, g = planted(per_sense=6)
    x = X[1]
    train = np.arange(len(x)) % 3 != 0
    sd = SenseDict(k={f"w{i}": 3 for i in range(6)}).fit(x[train], g[train])
    pred = sd.predict(x[~train], g[~train])
    # each predicted cluster maps to exactly one planted sense
    pairs = set(zip(g[~train], pred, s[~train]))
    assert len(pairs) == len(set(zip(g[~train], s[~train])))
    sup = SenseDict().fit(x[train], g[train], senses=s[train])
    assert sup.predict_names(x[~train], g[~train]) == list(s[~train])
    path = sup.save(tmp_path / "senses.npz")
    back = SenseDict.load(path)
    assert back.predict_names(x[~train], g[~train]) == list(s[~train])
    with pytest.raises(ValueError, match="no senses"):
        back.predict(x[:1], ["nope"])


# --- exactness of the fast paths: the exact ARI, batched k-means and sense_clustering against the references ---

from sklearn.metrics import adjusted_rand_score as sklearn_ari  # noqa: E402

from geometry.ari import adjusted_rand_score, adjusted_rand_scores  # noqa: E402


def test_ari_known_answers():
    assert adjusted_rand_score([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
    assert adjusted_rand_score([0, 0, 1, 2], [0, 0, 1, 1]) == pytest.approx(0.5714285714285714, abs=0)
    assert adjusted_rand_score([0, 0, 0, 0], [0, 1, 2, 3]) == 0.0
    assert adjusted_rand_score([0, 0, 1, 1], [0, 1, 0, 1]) == -0.5
    assert adjusted_rand_score(["a", "a", "b"], [7.0, 7.0, 3.0]) == 1.0  # any labels: only the partition counts
    assert adjusted_rand_score([], []) == 1.0


def test_ari_equals_sklearn_bit_for_bit():
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(3000):
        n = int(rng.integers(0, 40))
        cases.append((rng.integers(0, rng.integers(1, 9), n), rng.integers(0, rng.integers(1, 9), n)))
    for n in (1, 2, 3, 10, 57):  # degenerate partitions against each other and against random ones
        one, single = np.zeros(n, int), np.arange(n)
        halves = np.arange(n) % 2
        rand = rng.integers(0, 3, n)
        for a in (one, single, halves, rand):
            for b in (one, single, halves, rand, rng.permutation(a), 5 - a):
                cases.append((a, b))
    for a, b in cases:
        want = sklearn_ari(a, b)
        got = adjusted_rand_score(a, b)
        assert type(got) is float and (got == want or (np.isnan(got) and np.isnan(want))), (a, b, got, want)
    a = rng.integers(0, 4, (200, 12))
    b = rng.integers(0, 3, (200, 12))
    batch = adjusted_rand_scores(a, b)
    assert batch.tolist() == [sklearn_ari(x, y) for x, y in zip(a, b)]
    assert adjusted_rand_scores(a[0], b).tolist() == [sklearn_ari(a[0], y) for y in b]  # one truth, many


def test_ari_bad_input():
    with pytest.raises(ValueError, match="equal lengths"):
        adjusted_rand_score([0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="1-D"):
        adjusted_rand_score([[0, 1]], [[0, 1]])
    with pytest.raises(ValueError, match="2-D batch"):
        adjusted_rand_scores([0, 1], [0, 1])
    with pytest.raises(ValueError, match="shapes"):
        adjusted_rand_scores(np.zeros((2, 3)), np.zeros((3, 3)))
