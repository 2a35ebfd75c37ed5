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
from scipy.cluster.hierarchy import fcluster, linkage  # noqa: E402

from geometry import kmeans as kmeans_module  # noqa: E402
from geometry.ari import adjusted_rand_score, adjusted_rand_scores  # noqa: E402
from geometry.kmeans import kmeans_batch  # noqa: E402


def kmeans_reference(x, k, *, n_init=8, n_iter=50, seed=0):
    """The per-problem loop geometry.kmeans replaced (k-means++ via rng.choice, Lloyd, best inertia)."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    rng = np.random.default_rng(seed)
    best, best_inertia = None, np.inf
    for _ in range(n_init):
        centers = [x[rng.integers(n)]]
        for _ in range(1, k):
            d2 = np.min(((x[:, None] - np.array(centers)[None]) ** 2).sum(-1), axis=1)
            p = d2 / d2.sum() if d2.sum() > 0 else np.full(n, 1 / n)
            centers.append(x[rng.choice(n, p=p)])
        c = np.array(centers)
        for _ in range(n_iter):
            lab = ((x[:, None] - c[None]) ** 2).sum(-1).argmin(1)
            new = np.array([x[lab == j].mean(0) if np.any(lab == j) else c[j] for j in range(k)])
            if np.allclose(new, c):
                break
            c = new
        inertia = float(((x - c[lab]) ** 2).sum())
        if inertia < best_inertia - 1e-12:
            best, best_inertia = lab, inertia
    return best


def sense_clustering_reference(X, senses, groups, *, postprocessing="raw", n_init=8, seed=0, n_chance=50):
    """The per-layer, per-word loop sense_clustering replaced, with sklearn's ARI: (word_ari, chance)."""
    from geometry.postprocess import postprocess
    from geometry.senses import _rows_unit

    senses, groups = np.asarray(senses), np.asarray(groups)
    words = np.unique(groups)
    members = [np.flatnonzero(groups == w) for w in words]
    ks = [len(np.unique(senses[m])) for m in members]
    keep = [i for i, k in enumerate(ks) if k >= 2 and len(members[i]) > k]
    members, ks = [members[i] for i in keep], [ks[i] for i in keep]
    rng = np.random.default_rng(seed)
    chance = float(np.mean([np.mean([sklearn_ari(senses[m], rng.permutation(senses[m])) for _ in range(n_chance)])
                            for m in members]))
    word_ari = np.zeros((2, len(X), len(members)))
    for i in range(len(X)):
        x = np.asarray(X[i], dtype=np.float64)
        if postprocessing != "raw":
            x = postprocess(x, postprocessing).cpu().numpy()
        x = _rows_unit(x)
        for w, (m, k) in enumerate(zip(members, ks)):
            km = kmeans_reference(x[m], k, n_init=n_init, seed=seed)
            ward = fcluster(linkage(x[m], method="ward"), t=k, criterion="maxclust") - 1
            word_ari[0, i, w] = sklearn_ari(senses[m], km)
            word_ari[1, i, w] = sklearn_ari(senses[m], ward)
    return word_ari, chance


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


def _kmeans_cases():
    rng = np.random.default_rng(3)
    for t in range(160):
        n, d = int(rng.integers(2, 28)), int(rng.choice([1, 2, 5, 48, 576]))
        k = int(rng.integers(1, min(n, 8) + 1))
        kind = t % 4
        if kind == 0:    # generic
            x = rng.normal(size=(n, d))
        elif kind == 1:  # duplicated points (a static embedding layer: contexts sharing one state)
            x = rng.normal(size=(max(1, n // 3), d))[rng.integers(0, max(1, n // 3), n)]
        elif kind == 2:  # small integer grid: exact distance ties between centres
            x = rng.integers(-2, 3, (n, d)).astype(float)
        else:            # unit rows, as sense_clustering passes them
            x = rng.normal(size=(n, d)) + 3 * rng.normal(size=d)
            x /= np.linalg.norm(x, axis=1, keepdims=True)
        yield x, k, int(rng.integers(1, 9)), int(rng.choice([1, 2, 50])), int(rng.integers(0, 1000))


def test_kmeans_equals_the_reference_bit_for_bit():
    for x, k, n_init, n_iter, seed in _kmeans_cases():
        want = kmeans_reference(x, k, n_init=n_init, n_iter=n_iter, seed=seed)
        got = kmeans(x, k, n_init=n_init, n_iter=n_iter, seed=seed)
        assert got.dtype == want.dtype and np.array_equal(got, want), (x.shape, k, n_init, n_iter, seed)
    same = np.ones((5, 3))  # every point at one place: no distance to draw by (uniform k-means++ draw)
    assert np.array_equal(kmeans(same, 3, seed=4), kmeans_reference(same, 3, seed=4))


def test_kmeans_batch_equals_per_problem_and_chunks(monkeypatch):
    rng = np.random.default_rng(5)
    for n, k, d in ((4, 2, 576), (9, 3, 7), (13, 6, 48)):
        x = rng.normal(size=(23, n, d))
        x[3] = x[3, :1]           # one problem with all points equal
        x[7, 1:] = x[7, :-1]      # one with neighbouring duplicates
        want = np.stack([kmeans_reference(p, k, seed=11) for p in x])
        assert np.array_equal(kmeans_batch(x, k, seed=11), want)
        monkeypatch.setattr(kmeans_module, "_CHUNK_ELEMENTS", n * d * 8 * 3)  # three problems a chunk
        assert np.array_equal(kmeans_batch(x, k, seed=11), want)
        monkeypatch.undo()
    assert kmeans_batch(np.zeros((0, 3, 2)), 2).shape == (0, 3)


def test_kmeans_bad_input():
    x = np.random.default_rng(0).normal(size=(6, 3))
    with pytest.raises(ValueError, match="k: expected"):
        kmeans(x, 0)
    with pytest.raises(ValueError, match="n_init, n_iter"):
        kmeans(x, 2, n_init=0)
    with pytest.raises(ValueError, match="integers"):
        kmeans(x, 2.5)
    with pytest.raises(ValueError, match="finite"):
        kmeans(np.where(x > 1, np.nan, x), 2)
    with pytest.raises(ValueError, match="point, d"):
        kmeans(x[0], 1)
    with pytest.raises(ValueError, match="problem, point, d"):
        kmeans_batch(x, 1)


@pytest.mark.parametrize("postprocessing", ["raw", "standardize"])
def test_sense_clustering_equals_the_reference_bit_for_bit(postprocessing):
    X, s, g = planted(n_words=5, n_senses=3, per_sense=4, d=40)
    rng = np.random.default_rng(2)
    keep = rng.random(len(s)) > 0.25                     # uneven words: several (contexts, senses) shapes
    X, s, g = X[:, keep], s[keep], g[keep]
    X = np.concatenate([X, np.repeat(X[1][None, :1], 1, 0).repeat(len(s), 1)])  # a layer of one repeated state
    word_ari, chance = sense_clustering_reference(X, s, g, postprocessing=postprocessing, n_chance=7)
    res = sense_clustering(X, s, g, postprocessing=postprocessing, n_chance=7)
    assert np.array_equal(res.word_ari, word_ari) and res.chance == chance


def test_kmeans_assignment_is_the_exact_argmin_at_near_ties():
    """Points on the bisector of two centres: the exact sums decide (the Gram form's rounding cannot)."""
    rng = np.random.default_rng(8)
    runs, n, k, d = 50, 30, 3, 64
    c = rng.normal(size=(runs, k, d))
    mid, axis = (c[:, 0] + c[:, 1]) / 2, c[:, 0] - c[:, 1]
    v = rng.normal(size=(runs, n, d))
    v -= (v @ axis[..., None]) / (axis * axis).sum(-1)[:, None, None] * axis[:, None]  # orthogonal to c0 - c1
    x = mid[:, None] + 1e-3 * v
    x[:, ::2] = rng.normal(size=(runs, n // 2, d))       # and some points with clear winners
    exact = ((x[:, :, None] - c[:, None]) ** 2).sum(-1).argmin(-1)
    assert np.array_equal(kmeans_module._assign(x, (x * x).sum(-1), c), exact)


def test_ward_cut_equals_fcluster_maxclust():
    """The cut of agglomerative() is fcluster(Z, k, "maxclust"): numbering, dtype, ties and all."""
    from geometry.senses import _maxclust

    rng = np.random.default_rng(4)
    for t in range(600):
        n, d = int(rng.integers(2, 30)), int(rng.choice([1, 3, 40]))
        if t % 3 == 0:
            x = rng.normal(size=(n, d))
        elif t % 3 == 1:  # integer grid: equal merge heights, where the cut may leave fewer than k
            x = rng.integers(-1, 2, (n, d)).astype(float)
        else:             # duplicated points: zero heights
            x = rng.normal(size=(max(1, n // 3), d))[rng.integers(0, max(1, n // 3), n)]
        Z = linkage(x, method="ward")
        for k in range(1, n + 2):
            want = fcluster(Z, t=k, criterion="maxclust")
            got = _maxclust(Z, k)
            assert got.dtype == want.dtype and np.array_equal(got, want), (n, d, k)
        k = int(rng.integers(1, n + 1))
        want = np.zeros(n, dtype=int) if k == 1 else fcluster(Z, t=k, criterion="maxclust") - 1
        assert np.array_equal(agglomerative(x, k), want)


def test_sense_clustering_rejects_layers_of_different_widths():
    X, s, g = planted(n_words=2)
    with pytest.raises(ValueError, match="X\\[1\\]: expected shape"):
        sense_clustering([X[0], X[1][:, :-1]], s, g)
