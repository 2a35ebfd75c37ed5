"""k-means (k-means++ seeding, Lloyd iterations, best inertia of ``n_init`` restarts) for many tiny problems.

The sense study clusters each word's few contexts at every layer: thousands of problems of a handful
of points each, where a per-problem Python loop costs more than the arithmetic. :func:`kmeans_batch`
runs a stack of same-sized problems and all their restarts together, and returns for every problem
exactly the labels :func:`kmeans` would (the per-problem loop this module replaced; its reference
copy is in tests/geometry/test_senses.py), bit for bit:

- the random draws do not depend on the data: a restart draws its first centre with
  ``rng.integers(n)`` and each further one with ``rng.choice(n, p=p)``, which consumes exactly one
  ``rng.random()``; so the draws are replayed once per (n, k, n_init, seed) and shared by every
  problem, and ``choice``'s own arithmetic (cumulative sum, normalised, searched) is repeated on them;
- seeding distances are point-to-point: one exact pairwise table per problem serves all restarts
  and the first assignment;
- later assignments use the Gram form |x|² + |c|² − 2 x·c (one batched matmul), and a point whose
  two nearest centres are closer than that form's worst-case rounding error is assigned again with
  the exact sum of squared differences, so the argmin is the exact one;
- centres are sums in row order divided by counts, as ``x[lab == j].mean(0)``; convergence is
  ``np.allclose(new, c)`` per restart, and a restart whose labels did not change has converged
  without computing it (its new centres are its centres); inertias are the same flat sums;
- restarts that drew the same seeds are run once, and inertias are computed only for problems
  whose restarts end with different labels (elsewhere every choice returns the same labels).

Axes: x (point, d) for :func:`kmeans`, (problem, point, d) for :func:`kmeans_batch`; labels (…, point).
"""

from __future__ import annotations

import functools
import operator

import numpy as np

__all__ = ["kmeans", "kmeans_batch"]

_CHUNK_ELEMENTS = 1 << 21   # restarts x points x d per chunk of problems (16 MB of float64)


def _check(x: np.ndarray, k, n_init, n_iter, seed) -> tuple[int, int, int, int]:
    n = x.shape[-2]
    try:
        k, n_init, n_iter, seed = (operator.index(v) for v in (k, n_init, n_iter, seed))
    except TypeError:
        raise ValueError(f"k, n_init, n_iter, seed: expected integers, got {k!r}, {n_init!r}, {n_iter!r}, "
                         f"{seed!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"k: expected 1 <= k <= n_points={n}, got {k}")
    if n_init < 1 or n_iter < 1:
        raise ValueError(f"n_init, n_iter: expected positive integers, got {n_init} and {n_iter}")
    if not np.all(np.isfinite(x)):
        raise ValueError("x: expected finite values, got NaN/inf")
    return k, n_init, n_iter, seed


@functools.lru_cache(maxsize=512)
def _draws(n: int, k: int, n_init: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """First centre (restart,) and the uniforms (restart, k - 1) the k-means++ choices consume."""
    rng = np.random.default_rng(seed)
    first = np.empty(n_init, dtype=np.int64)
    u = np.empty((n_init, k - 1))
    for r in range(n_init):
        first[r] = rng.integers(n)
        for t in range(k - 1):
            u[r, t] = rng.random()  # what rng.choice(n, p=p) draws; it returns cdf.searchsorted(u, "right")
    first.flags.writeable = False
    u.flags.writeable = False
    return first, u


def _pairwise_sq(x: np.ndarray) -> np.ndarray:
    """(problem, point, point) sums of squared differences, each as ``((a - b) ** 2).sum()``."""
    p, n, _ = x.shape
    out = np.zeros((p, n, n))
    for i in range(n - 1):
        dd = ((x[:, i + 1:] - x[:, i:i + 1]) ** 2).sum(-1)  # (a - b)² == (b - a)² exactly
        out[:, i, i + 1:] = dd
        out[:, i + 1:, i] = dd
    return out


def _seed(D: np.ndarray, k: int, first: np.ndarray, u: np.ndarray) -> np.ndarray:
    """k-means++ centre indices (problem, restart, k), as ``rng.choice`` picks them."""
    p, n, _ = D.shape
    idx = np.empty((p, len(first), k), dtype=np.int64)
    idx[:, :, 0] = first
    d2 = D[:, first, :]                                        # (problem, restart, point)
    rows = np.arange(p)[:, None]
    for t in range(1, k):
        total = d2.sum(-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            prob = np.where(total > 0, d2 / total, 1 / n)
        cdf = np.cumsum(prob, axis=-1)
        cdf /= cdf[..., -1:]
        new = (cdf <= u[None, :, t - 1, None]).sum(-1)         # searchsorted(cdf, u, side="right")
        idx[:, :, t] = new
        d2 = np.minimum(d2, D[rows, new])
    return idx


def _assign(x: np.ndarray, xx: np.ndarray, c: np.ndarray) -> np.ndarray:
    """argmin_j of ((x_i - c_j) ** 2).sum() for (run, point, d) and centres (run, k, d)."""
    k, d = c.shape[1], c.shape[2]
    if k == 1:
        return np.zeros(x.shape[:2], dtype=np.int64)
    cc = (c * c).sum(-1)
    approx = xx[:, :, None] + cc[:, None, :] - 2.0 * np.matmul(x, c.transpose(0, 2, 1))
    lab = approx.argmin(-1)
    best = np.take_along_axis(approx, lab[..., None], -1)[..., 0]
    np.put_along_axis(approx, lab[..., None], np.inf, -1)
    second = approx.min(-1)
    # |Gram form - exact sum| <= 2 (d + 3) eps (|x|² + |c|²) for any summation order; 8x margin
    tol = 16.0 * (d + 8) * np.finfo(np.float64).eps * (xx + cc.max(-1)[:, None])
    a, i = np.nonzero(~(second - best > 2.0 * tol))
    if len(a):
        lab[a, i] = ((x[a, i][:, None, :] - c[a]) ** 2).sum(-1).argmin(-1)
    return lab


def _means(x: np.ndarray, lab: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Centres as ``x[lab == j].mean(0)`` (rows summed in order), an empty cluster keeping its centre."""
    runs = np.arange(len(x))
    s = np.zeros_like(c)
    count = np.zeros(c.shape[:2])
    for i in range(x.shape[1]):
        s[runs, lab[:, i]] += x[:, i]
        count[runs, lab[:, i]] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count[..., None] > 0, s / count[..., None], c)


def _kmeans_chunk(x: np.ndarray, k: int, n_init: int, n_iter: int, seed: int) -> np.ndarray:
    p, n, d = x.shape
    first, u = _draws(n, k, n_init, seed)
    D = _pairwise_sq(x)
    idx = _seed(D, k, first, u)                                # (problem, restart, k)
    # restarts seeded alike run alike: run each distinct seeding of a problem once
    same = (idx[:, :, None] == idx[:, None]).all(-1)           # (problem, restart, restart)
    twin = same.argmax(-1)                                     # first restart seeded like this one
    owner, rst = np.nonzero(twin == np.arange(n_init))          # the distinct runs
    run = np.full((p, n_init), -1)
    run[owner, rst] = np.arange(len(owner))
    run = np.take_along_axis(run, twin, 1)                     # (problem, restart) -> its run
    seeds = idx[owner, rst]                                    # (run, k)
    c = x[owner[:, None], seeds]                               # (run, k, d)
    # the seeded centres are points, so the exact table has the first assignment's distances
    lab = D[owner[:, None, None], np.arange(n)[None, :, None], seeds[:, None, :]].argmin(-1)
    xx = (x * x).sum(-1)
    live = np.arange(len(owner))
    xa, la = x[owner], lab
    for it in range(n_iter):
        if it:
            xa = x[owner[live]]
            la = _assign(xa, xx[owner[live]], c[live])
            moved = (la != lab[live]).any(1)  # same labels: the new centres are these centres, allclose
            lab[live] = la
            live, xa, la = live[moved], xa[moved], la[moved]
            if not len(live):
                break
        ca = c[live]
        new = _means(xa, la, ca)
        done = (np.abs(new - ca) <= 1e-08 + 1e-05 * np.abs(ca)).all((1, 2))  # np.allclose(new, c), finite
        c[live[~done]] = new[~done]
        live = live[~done]
        if not len(live):
            break
    labels = lab[run]                                          # (problem, restart, point)
    out = labels[:, 0].copy()
    varied = np.flatnonzero(~(labels == labels[:, :1]).all((1, 2)))
    if len(varied):  # only where the restarts disagree does the best inertia decide
        runs = np.unique(run[varied])
        inertia = np.full(len(owner), np.nan)
        diff = x[owner[runs]] - c[runs[:, None], lab[runs]]
        inertia[runs] = (diff ** 2).reshape(len(runs), n * d).sum(1)  # as float(((x - c[lab]) ** 2).sum())
        inertia = inertia[run[varied]]                         # (varied problem, restart)
        best = np.full(len(varied), np.inf)
        pick = np.zeros(len(varied), dtype=np.int64)
        for r in range(n_init):  # first restart that improves by more than 1e-12, in restart order
            better = inertia[:, r] < best - 1e-12
            best[better] = inertia[better, r]
            pick[better] = r
        out[varied] = labels[varied, pick]
    return out


def kmeans_batch(x, k: int, *, n_init: int = 8, n_iter: int = 50, seed: int = 0) -> np.ndarray:
    """Labels (problem, point): for each x[p] (point, d), exactly ``kmeans(x[p], k, ...)``."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"x: expected (problem, point, d), got shape {x.shape}")
    k, n_init, n_iter, seed = _check(x, k, n_init, n_iter, seed)
    p, n, d = x.shape
    step = max(1, _CHUNK_ELEMENTS // max(1, n_init * n * d))
    out = np.empty((p, n), dtype=np.int64)
    for lo in range(0, p, step):
        out[lo:lo + step] = _kmeans_chunk(x[lo:lo + step], k, n_init, n_iter, seed)
    return out


def kmeans(x, k: int, *, n_init: int = 8, n_iter: int = 50, seed: int = 0) -> np.ndarray:
    """Labels (point,) of Euclidean k-means with k-means++ seeding, best inertia of ``n_init``."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"x: expected (point, d), got shape {x.shape}")
    return kmeans_batch(x[None], k, n_init=n_init, n_iter=n_iter, seed=seed)[0]
