"""Word-sense structure of contextual states: per-layer clustering agreement and sense dictionaries.

For each word (group), its contexts' states are clustered into k = number of its senses, and the
clusters are compared with the sense labels by the adjusted Rand index (ARI; 0 = chance, 1 =
identical partitions; :mod:`geometry.ari`, sklearn's value without its per-call validation). Two
clusterers: k-means (:mod:`geometry.kmeans`: k-means++ seeding, Lloyd iterations, best of ``n_init``
restarts; the groups are tiny and numerous, so every layer of all words with the same numbers of
contexts and senses is one batch) and agglomerative clustering (Ward linkage, scipy). Rows are L2-normalised first, so both cluster by
direction as cosine kNN does (Ethayarajh 2019; Wiedemann et al. 2019 use cosine kNN for senses).
ARI is macro-averaged over words. Baselines: ``most_frequent_sense`` as a clustering (everything
in one cluster) has ARI 0 by definition; ``chance`` is the mean ARI of random labelings with the
true cluster sizes (≈ 0; estimated so a reader sees the spread of small groups).

Post-processing (Timkey & van Schijndel 2021: a few rogue dimensions dominate cosine similarity;
clipping / standardising exposes sense structure): :func:`sense_clustering` can first pass each
layer's (context, d_model) matrix through :func:`geometry.postprocess.postprocess` ("clip",
"standardize", ...), fitted on all contexts of the layer together.

Sense dictionaries (:class:`SenseDict`, after the "SenseDict" idea of per-word sense centroids):
cluster a word's states across a corpus into sense centroids (or average labelled senses), save
them as one ``.npz`` (no pickle), and say for a new context which centroid (cosine) it is nearest.

Axes: X (layer, context, d_model) or a sequence of (context, d_model); senses, groups (context,).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.cluster.hierarchy import linkage

from .ari import adjusted_rand_scores
from .kmeans import kmeans, kmeans_batch
from .postprocess import postprocess

__all__ = ["SenseClusterResult", "sense_clustering", "kmeans", "agglomerative", "SenseDict", "pca_2d",
           "CLUSTERERS"]

CLUSTERERS = ("kmeans", "agglomerative")


def _rows_unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def agglomerative(x: np.ndarray, k: int) -> np.ndarray:
    """Labels (context,) of Ward agglomerative clustering cut at k clusters."""
    x = np.asarray(x, dtype=np.float64)
    if not 1 <= k <= len(x):
        raise ValueError(f"k: expected 1 <= k <= n_points={len(x)}, got {k}")
    if k == 1 or len(x) < 2:
        return np.zeros(len(x), dtype=int)
    return _maxclust(linkage(x, method="ward"), k) - 1


def _maxclust(Z: np.ndarray, k: int) -> np.ndarray:
    """``fcluster(Z, t=k, criterion="maxclust")`` for a linkage ``Z`` just made by ``linkage``, without
    fcluster's validation of Z (~95 µs, three times scipy's Ward on a word's handful of contexts):
    scipy's own steps in Python, compared with fcluster in tests/geometry/test_senses.py. The
    largest merge height under each node; a binary search for the lowest of those heights that cuts
    the tree into at most k clusters (index -1 standing for minus infinity); clusters numbered from
    1 in the order a depth-first walk from the root, left child first, reaches them."""
    n = len(Z) + 1
    if k >= n:
        return np.arange(1, n + 1, dtype=np.intc)
    left, right, height = Z[:, 0].astype(np.intp).tolist(), Z[:, 1].astype(np.intp).tolist(), Z[:, 2].tolist()
    top = height[:]                      # max merge height in each node's subtree; children come first
    for i in range(n - 1):
        for c in (left[i], right[i]):
            if c >= n and top[c - n] > top[i]:
                top[i] = top[c - n]
    lower, upper = -1, n - 1
    while upper - lower > 1:
        i = (lower + upper) >> 1
        # clusters at threshold t: n minus the merges at or below it (top only grows towards the root)
        if n - sum(t <= top[i] for t in top) > k:
            lower = i
        else:
            upper = i
    cutoff = top[upper]
    labels = [0] * n
    count, leader = 0, -1
    seen = [False] * (2 * n - 1)
    stack = [2 * n - 2]
    while stack:
        root = stack[-1] - n
        lc, rc = left[root], right[root]
        if leader == -1 and top[root] <= cutoff:  # this subtree is one cluster
            leader = root
            count += 1
        if lc >= n and not seen[lc]:
            seen[lc] = True
            stack.append(lc)
            continue
        if rc >= n and not seen[rc]:
            seen[rc] = True
            stack.append(rc)
            continue
        for c in (lc, rc):
            if c < n:
                if leader == -1:     # a singleton cluster
                    count += 1
                labels[c] = count
        if leader == root:
            leader = -1
        stack.pop()
    return np.array(labels, dtype=np.intc)


@dataclass(frozen=True)
class SenseClusterResult:
    """layers (layer,); ari (method, layer): macro-mean ARI over words for each of ``methods``;
    word_ari (method, layer, word); words (word,); chance: mean ARI of random labelings with the true
    sense sizes; most_frequent_sense: 0.0 (one cluster); postprocessing: name applied first."""

    layers: np.ndarray
    methods: tuple
    ari: np.ndarray
    word_ari: np.ndarray
    words: np.ndarray
    chance: float
    most_frequent_sense: float
    postprocessing: str

    def by_method(self, method: str) -> np.ndarray:
        return self.ari[self.methods.index(method)]


def _layer(X, i):
    a = X[i]
    return a.detach().cpu().double().numpy() if hasattr(a, "detach") else np.asarray(a, dtype=np.float64)


def sense_clustering(X, senses, groups, *, methods=CLUSTERERS, postprocessing: str = "raw", layers=None,
                     n_init: int = 8, seed: int = 0, n_chance: int = 50) -> SenseClusterResult:
    """Per-layer ARI of clustering each group's contexts into its number of senses."""
    n_layers = len(X)
    senses, groups = np.asarray(senses), np.asarray(groups)
    n = len(senses)
    if n_layers == 0:
        raise ValueError("X: expected at least one layer, got none")
    if len(groups) != n:
        raise ValueError(f"senses and groups: expected equal lengths, got {n} and {len(groups)}")
    bad = [m for m in methods if m not in CLUSTERERS]
    if bad:
        raise ValueError(f"methods: expected some of {CLUSTERERS}, got {bad}")
    words = np.unique(groups)
    members = [np.flatnonzero(groups == w) for w in words]
    ks = [len(np.unique(senses[m])) for m in members]
    keep = [i for i, k in enumerate(ks) if k >= 2 and len(members[i]) > k]
    if not keep:
        raise ValueError("groups: expected at least one word with 2+ senses and more contexts than senses")
    words, members, ks = words[keep], [members[i] for i in keep], [ks[i] for i in keep]
    codes = [np.unique(senses[m], return_inverse=True)[1].reshape(-1) for m in members]  # ARI sees partitions
    rng = np.random.default_rng(seed)
    # permuting the codes draws what permuting the labels does (the draws depend on the length only)
    chance = float(np.mean([np.mean(adjusted_rand_scores(c, np.stack([rng.permutation(c) for _ in range(n_chance)])))
                            for c in codes]))
    xs = None  # (layer, context, d_model): every layer post-processed and unit rows, for the batches
    for i in range(n_layers):
        x = _layer(X, i)
        if x.shape[0] != n:
            raise ValueError(f"X[{i}]: expected {n} rows (one per context), got {x.shape[0]}")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"X[{i}]: expected finite values, got NaN/inf")
        if postprocessing != "raw":
            x = postprocess(x, postprocessing).cpu().numpy()
        if xs is None:
            xs = np.empty((n_layers,) + x.shape)
        elif x.shape != xs.shape[1:]:
            raise ValueError(f"X[{i}]: expected shape {xs.shape[1:]} as X[0], got {x.shape}")
        xs[i] = _rows_unit(x)
    word_ari = np.zeros((len(methods), n_layers, len(words)))
    for j, method in enumerate(methods):
        if method == "kmeans":
            # every layer of the words with the same (contexts, senses) is one batch of same-sized problems
            shapes: dict = {}
            for w, (m, k) in enumerate(zip(members, ks)):
                shapes.setdefault((len(m), k), []).append(w)
            for (size, k), ws in shapes.items():
                lab = kmeans_batch(np.concatenate([xs[:, members[w]] for w in ws]), k, n_init=n_init, seed=seed)
                truth = np.concatenate([np.broadcast_to(codes[w], (n_layers, size)) for w in ws])
                word_ari[j][:, ws] = adjusted_rand_scores(truth, lab).reshape(len(ws), n_layers).T
        else:
            for w, (m, k) in enumerate(zip(members, ks)):
                lab = np.stack([agglomerative(xs[i, m], k) for i in range(n_layers)])
                word_ari[j, :, w] = adjusted_rand_scores(codes[w], lab)
    return SenseClusterResult(
        layers=np.arange(n_layers) if layers is None else np.asarray(layers), methods=tuple(methods),
        ari=word_ari.mean(2), word_ari=word_ari, words=words, chance=chance, most_frequent_sense=0.0,
        postprocessing=postprocessing)


def pca_2d(x) -> np.ndarray:
    """(context, 2) projection on the top two principal components (sign fixed: largest |loading| > 0)."""
    x = np.asarray(x, dtype=np.float64)
    xc = x - x.mean(0)
    if len(x) < 2:
        return np.zeros((len(x), 2))
    u, s, vt = np.linalg.svd(xc, full_matrices=False)
    vt = vt[:2]
    signs = np.sign(vt[np.arange(len(vt)), np.abs(vt).argmax(1)])
    out = xc @ (vt * signs[:, None]).T
    return np.pad(out, ((0, 0), (0, 2 - out.shape[1])))


class SenseDict:
    """Per-word sense centroids. ``SenseDict(k=2).fit(X, words)`` clusters each word's states
    (unit-normalised, k-means) into ``k`` centroids (``k`` may be a dict word -> k); with
    ``senses`` given, ``fit(X, words, senses)`` averages the labelled senses instead. Fitted:
    ``centroids_`` (word -> (sense, d_model) unit rows), ``sense_names_`` (word -> list of names).
    ``predict(X, words)`` -> index of the nearest (cosine) centroid of each context's word;
    ``predict_names`` -> the sense names. ``save(path)`` / ``SenseDict.load(path)``: one ``.npz``."""

    def __init__(self, k: "int | dict" = 2, n_init: int = 8, seed: int = 0):
        self.k = k
        self.n_init = n_init
        self.seed = seed

    def fit(self, X, words, senses=None) -> "SenseDict":
        x = _rows_unit(np.asarray(X, dtype=np.float64))
        words = np.asarray(words)
        if x.ndim != 2 or len(words) != len(x):
            raise ValueError(f"X, words: expected (context, d_model) and (context,), got {x.shape} and {words.shape}")
        if senses is not None and len(senses) != len(x):
            raise ValueError(f"senses: expected {len(x)} labels, got {len(senses)}")
        self.centroids_, self.sense_names_ = {}, {}
        for w in np.unique(words):
            m = words == w
            if senses is not None:
                names = sorted(set(np.asarray(senses)[m].tolist()))
                lab = np.array([names.index(s) for s in np.asarray(senses)[m]])
            else:
                k = self.k.get(w, 2) if isinstance(self.k, dict) else self.k
                k = min(int(k), int(m.sum()))
                lab = kmeans(x[m], k, n_init=self.n_init, seed=self.seed)
                names = [f"{w}#{j}" for j in range(k)]
            c = np.array([x[m][lab == j].mean(0) for j in range(len(names))])
            self.centroids_[str(w)] = _rows_unit(c)
            self.sense_names_[str(w)] = [str(s) for s in names]
        self.d_model_ = x.shape[1]
        return self

    def predict(self, X, words) -> np.ndarray:
        x = _rows_unit(np.asarray(X, dtype=np.float64))
        if x.ndim != 2 or x.shape[1] != self.d_model_:
            raise ValueError(f"X: expected (context, {self.d_model_}), got {x.shape}")
        out = np.empty(len(x), dtype=int)
        for i, w in enumerate(np.asarray(words)):
            if str(w) not in self.centroids_:
                raise ValueError(f"word {w!r} has no senses in this dictionary (has {len(self.centroids_)} words)")
            out[i] = int((self.centroids_[str(w)] @ x[i]).argmax())
        return out

    def predict_names(self, X, words) -> list[str]:
        return [self.sense_names_[str(w)][j] for w, j in zip(np.asarray(words), self.predict(X, words))]

    def save(self, path) -> Path:
        path = Path(path)
        words = sorted(self.centroids_)
        meta = {"format": "lens-sense-dict", "version": 1, "words": words,
                "sense_names": [self.sense_names_[w] for w in words], "d_model": self.d_model_}
        np.savez_compressed(path, meta=np.array(json.dumps(meta)),
                            centroids=np.concatenate([self.centroids_[w] for w in words]))
        return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")

    @classmethod
    def load(cls, path) -> "SenseDict":
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            cents = z["centroids"]
        if meta.get("format") != "lens-sense-dict":
            raise ValueError(f"{path}: expected a sense dictionary saved by SenseDict.save, got {meta.get('format')!r}")
        sd = cls()
        sd.centroids_, sd.sense_names_, sd.d_model_ = {}, {}, int(meta["d_model"])
        lo = 0
        for w, names in zip(meta["words"], meta["sense_names"]):
            sd.centroids_[w] = cents[lo:lo + len(names)]
            sd.sense_names_[w] = list(names)
            lo += len(names)
        return sd
