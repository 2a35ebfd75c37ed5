"""The intrinsic-dimension "hunchback" of a sequence-level point cloud across layers, with its interval,
its stability and a null.

Conventions (fixed once here)
-----------------------------
- ``layers`` is a sequence of ``(n_points, d)`` matrices, one per layer, whose rows are the **same
  sequences** in the same order (one point per sequence: its last token's state, or the mean over its
  tokens). The papers whose claim this judges build that cloud, not the cloud of every token: Valeriani et
  al. 2023 (NeurIPS, "The geometry of hidden representations of large transformer models") and Cheng et al.
  2025 (ICLR, "Emergence of a high-dimensional abstraction phase in language transformers"; their code takes
  the last token of each sequence and 10,000 sequences per random partition).
- The estimator is TwoNN (Facco et al. 2017), linear fit of skdim 0.5 (:func:`geometry.intrinsic_dim.
  twonn_from_ratios`): per point the ratio μ = r2 / r1 of its two nearest neighbours' distances among the
  layer's points. A point whose nearest neighbour is at distance 0 (an exact duplicate) or whose two nearest
  neighbours tie has no ratio (NaN) and is left out at that layer, as in Valeriani et al.'s code; on one
  cloud (:func:`twonn_ratios`) exact duplicates are dropped first, the first copy kept, as
  :class:`geometry.TwoNN` does (the pooled clouds of the null leave every copy out instead).
  Distances are dense and exact (float64 on centred points): a sequence-level cloud holds thousands of
  points, not millions.
- **The statistic** (:func:`hunchback_statistic`): with the profile d_0 … d_{L-1}, the peak is the
  interior layer (neither first nor last) of the highest ID, and the statistic is
  ``d_peak − max(d_0, d_{L-1})``: how far the interior maximum rises above the higher of the two ends.
  Positive means an interior peak that beats both ends; negative means an end is the highest.
- **Cross-fitting** (:func:`hunchback`): the peak chosen on a sample and read on the same sample is the
  highest of many noisy layers, so on a flat profile the statistic comes out positive (measured: with 30
  layers of one dimension, a 95% interval lay wholly above 0 in 2–4 of 20 draws, re-chosen in each
  bootstrap replicate or not). So the judged statistic is cross-fitted: the units are split at random into
  two halves, the peak layer chosen on one half's profile is read on the other half's, both ways, averaged
  over several splits; on a flat profile it is 0 or a little below on average (the higher of two noisy ends
  is itself a little optimistic, which leans the verdict away from "agrees"). The statistic read on the full
  profile at its own peak is kept beside it (``raw``).
- **The interval**: TwoNN's likelihood treats the ratios as independent draws of one Pareto law (Facco et
  al. 2017), so its bootstrap resamples them: whole units (documents, or sequences) are drawn with
  replacement, every layer's ratios of the drawn units enter that replicate (paired across layers), and the
  cross-fitted statistic is recomputed with fresh splits. Resampling the points themselves and searching
  neighbours again would put copies of one point at distance 0. ``peak_support`` (the share of replicates
  whose own interior maximum is at the full profile's peak layer) says how firmly the peak's place is
  known: an argmax flips on noise.
- **The null** (:func:`label_permutation_null`): the same statistic on a control cloud with the structure
  removed (shuffled text) and a permutation test of the difference ``T(real) − T(control)`` of the raw
  statistic (a selection optimism that both clouds share cancels in it): the
  sequences of both clouds are pooled, relabelled at random into groups of the original sizes (a sequence
  keeps its rows at every layer), and the difference recomputed; the add-one p-value
  (:func:`studies.core.stability.add_one_p`) is exact when real and control sequences are exchangeable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from .arrays import as_matrix

__all__ = ["twonn_ratios", "twonn_dimension", "id_profile", "hunchback_statistic", "hunchback", "Hunchback",
           "label_permutation_null"]


def _centred(X: Any, name: str = "layer states") -> torch.Tensor:
    T = as_matrix(X, name, dtype=torch.float64, device="cpu")
    if not torch.isfinite(T).all():
        raise ValueError(f"{name} must be finite; got NaN or inf")
    return T - T.mean(0, keepdim=True)


def _distances(T: torch.Tensor) -> torch.Tensor:
    """Dense Euclidean distances between the rows of ``T`` (float64, from the Gram matrix: used only to find
    the two nearest neighbours, whose distances are then computed exactly)."""
    sq = (T * T).sum(1)
    return (sq[:, None] + sq[None, :] - 2.0 * (T @ T.T)).clamp_min_(0.0).sqrt_()


def _ratios(T: torch.Tensor, D: torch.Tensor) -> np.ndarray:
    """μ = r2 / r1 per row of ``T`` (NaN for a row with r1 == 0 or r1 == r2), neighbours found in ``D``."""
    n = T.shape[0]
    if n < 3:
        raise ValueError(f"TwoNN needs at least 3 points; got {n}")
    D = D.clone()
    D.fill_diagonal_(math.inf)
    nn = torch.topk(D, 2, dim=1, largest=False).indices
    r1 = (T - T[nn[:, 0]]).norm(dim=1)
    r2 = (T - T[nn[:, 1]]).norm(dim=1)
    r1, r2 = torch.minimum(r1, r2).numpy(), torch.maximum(r1, r2).numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = r2 / r1
    mu[(r1 <= 0) | (r1 == r2) | ~np.isfinite(mu)] = np.nan
    return mu


def twonn_ratios(X: Any) -> np.ndarray:
    """``(n_points,)`` TwoNN ratios μ = r2 / r1 of the rows of ``X`` (module docstring; NaN: no ratio). Exact
    duplicate rows are dropped first, the first copy kept, as :class:`geometry.TwoNN` does (a copy: NaN)."""
    T = _centred(X)
    _, first = np.unique(T.numpy(), axis=0, return_index=True)
    first = np.sort(first)
    mu = np.full(T.shape[0], np.nan)
    if first.size < T.shape[0]:
        U = T[torch.from_numpy(first)]
        mu[first] = _ratios(U, _distances(U))
    else:
        mu[:] = _ratios(T, _distances(T))
    return mu


def twonn_dimension(mu: np.ndarray, discard_fraction: float = 0.1) -> float:
    """The TwoNN estimate (linear fit through the origin, skdim 0.5's convention) from ratios ``mu``; NaN
    ratios are left out, repeated ones (a bootstrap replicate) count as often as they come."""
    mu = np.asarray(mu, dtype=np.float64)
    mu = mu[np.isfinite(mu)]
    N = mu.size
    n_keep = int(N * (1 - discard_fraction))
    if n_keep < 2:
        raise ValueError(f"TwoNN needs at least 2 ratios left after discarding {discard_fraction:.0%}; got "
                         f"{n_keep} of {N}")
    x = np.sort(np.log(mu))[:n_keep]
    y = -np.log1p(-np.arange(1, n_keep + 1, dtype=np.float64) / N)
    return float((x * y).sum() / (x * x).sum())


def id_profile(layers: Sequence[Any], discard_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """(profile, ratios): the TwoNN estimate per layer and the ``(layer, point)`` ratios behind it."""
    if not len(layers):
        raise ValueError("layers must hold at least one matrix; got none")
    mus = [twonn_ratios(X) for X in layers]
    n = {m.size for m in mus}
    if len(n) != 1:
        raise ValueError(f"every layer must hold the same sequences; got point counts {sorted(n)}")
    mu = np.stack(mus)
    return np.array([twonn_dimension(m, discard_fraction) for m in mu]), mu


def hunchback_statistic(profile: Sequence[float]) -> tuple[float, int]:
    """(statistic, peak index): the interior maximum of ``profile`` minus the higher of its two ends
    (module docstring). Needs at least 3 layers."""
    p = np.asarray(profile, dtype=np.float64)
    if p.size < 3:
        raise ValueError(f"an interior peak needs at least 3 layers; got {p.size}")
    if not np.all(np.isfinite(p)):
        raise ValueError("the ID profile holds a non-finite value")
    peak = 1 + int(np.argmax(p[1:-1]))
    return float(p[peak] - max(p[0], p[-1])), peak


def _twonn_rows(mu: np.ndarray, discard_fraction: float) -> np.ndarray:
    """:func:`twonn_dimension` of every row of ``mu`` (layer, point) at once (NaN where a row has too few
    ratios)."""
    x = np.sort(np.log(mu), axis=1)  # NaN (no ratio) sorts last
    N = np.isfinite(x).sum(1)
    keep = (N * (1 - discard_fraction)).astype(np.int64)
    i = np.arange(1, x.shape[1] + 1)[None, :]
    w = i <= keep[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = -np.log1p(-np.where(w, i / np.maximum(N, 1)[:, None], 0.0))
        x = np.where(w, x, 0.0)
        out = (x * y).sum(1) / (x * x).sum(1)
    out[keep < 2] = np.nan
    return out


class _Units:
    """The rows of each unit (codes 0..G-1), gathered without a Python loop over units: ``rows(units, reps)``
    is every row of each unit of ``units`` repeated ``reps`` times, in some order — what the TwoNN of a
    replicate reads is the sorted multiset of its rows' ratios (:func:`_twonn_rows`), so the order does not
    change a bit of it."""

    def __init__(self, codes: np.ndarray, G: int):
        self.flat = np.argsort(codes, kind="stable")
        self.size = np.bincount(codes, minlength=G)
        self.start = np.cumsum(self.size) - self.size

    def rows(self, units: np.ndarray, reps: np.ndarray | None = None) -> np.ndarray:
        lens = self.size[units]
        offs = np.repeat(self.start[units] - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
        out = self.flat[offs]
        return out if reps is None else np.repeat(out, np.repeat(reps, lens))


def _crossfit(mu: np.ndarray, members: "_Units", draws: np.ndarray, rng, n_splits: int, discard_fraction: float
              ) -> float:
    """The cross-fitted statistic of the units ``draws`` (with repeats): the distinct units are split at random
    into two halves; the peak layer chosen on one half's profile is read on the other's,
    ``d_peak − max(d_first, d_last)``, both ways; the mean over ``n_splits`` splits. NaN with fewer than 2
    distinct units."""
    uniq, counts = np.unique(draws, return_counts=True)
    if uniq.size < 2:
        return float("nan")
    values = []
    for _ in range(n_splits):
        order = rng.permutation(uniq.size)
        halves = (order[: uniq.size // 2], order[uniq.size // 2:])
        profiles = []
        for h in halves:
            idx = members.rows(uniq[h], counts[h])
            profiles.append(_twonn_rows(mu[:, idx], discard_fraction))
        if not all(np.all(np.isfinite(p)) for p in profiles):
            continue
        for a, b in ((0, 1), (1, 0)):
            peak = 1 + int(np.argmax(profiles[a][1:-1]))
            values.append(profiles[b][peak] - max(profiles[b][0], profiles[b][-1]))
    return float(np.mean(values)) if values else float("nan")


@dataclass(frozen=True)
class Hunchback:
    """The hunchback statistic of one sequence-level cloud.

    Attributes (axes in brackets)
    -----------------------------
    profile : [layer] TwoNN estimate on all points. low, high : [layer] its bootstrap interval.
    statistic : the cross-fitted d_peak − max(d_first, d_last) (module docstring); statistic_low,
    statistic_high : its bootstrap interval. raw : the same read on the full profile at its own peak
    (optimistic: the highest of many noisy layers). peak : index of the full profile's interior peak.
    peak_support : share of replicates whose own interior maximum is at ``peak``. replicates : [replicate]
    the statistic in each bootstrap replicate. n_points : points (sequences). n_units : units resampled.
    level : the interval's level.
    """

    profile: np.ndarray
    low: np.ndarray
    high: np.ndarray
    statistic: float
    statistic_low: float
    statistic_high: float
    raw: float
    peak: int
    peak_support: float
    replicates: np.ndarray
    n_points: int
    n_units: int
    level: float


def hunchback(layers: Sequence[Any] | None = None, units: Sequence | None = None, *, ratios: np.ndarray | None = None,
              n_boot: int = 1000, level: float = 0.95, discard_fraction: float = 0.1, n_splits: int = 4,
              seed: int = 0) -> Hunchback:
    """The hunchback statistic of a sequence-level cloud with a bootstrap over ``units`` (module docstring).

    ``layers``: the per-layer ``(n_points, d)`` matrices (or ``ratios``: their ``(layer, point)`` TwoNN
    ratios already computed); ``units``: per point, the unit resampled and split whole (a document id;
    default: each point its own unit); ``n_splits``: random halvings of the units the cross-fitted statistic
    averages over (the full sample's uses 8 times as many); ``n_boot=0``: no interval."""
    if ratios is None:
        if layers is None:
            raise ValueError("hunchback needs the layers' states or their ratios; got neither")
        profile, mu = id_profile(layers, discard_fraction)
    else:
        mu = np.asarray(ratios, dtype=np.float64)
        if mu.ndim != 2:
            raise ValueError(f"ratios must be (layer, point); got shape {mu.shape}")
        profile = np.array([twonn_dimension(m, discard_fraction) for m in mu])
    L, n = mu.shape
    raw, peak = hunchback_statistic(profile)
    units = np.arange(n) if units is None else np.asarray(units)
    if units.shape != (n,):
        raise ValueError(f"units must give one unit per point ({n}); got shape {units.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1); got {level}")
    if n_splits < 1:
        raise ValueError(f"n_splits must be >= 1; got {n_splits}")
    codes = np.unique(units, return_inverse=True)[1].reshape(-1)
    G = int(codes.max()) + 1
    members = _Units(codes, G)
    rng = np.random.default_rng(seed)
    stat = _crossfit(mu, members, np.arange(G), rng, 8 * n_splits, discard_fraction)
    reps = np.full((n_boot, L), np.nan)
    t = np.full(n_boot, np.nan)
    for b in range(n_boot):
        draws = rng.integers(0, G, size=G)
        reps[b] = _twonn_rows(mu[:, members.rows(draws)], discard_fraction)
        t[b] = _crossfit(mu, members, draws, rng, n_splits, discard_fraction)
    ok = np.all(np.isfinite(reps), axis=1)
    a = (1 - level) / 2
    lo = hi = np.full(L, np.nan)
    support = t_lo = t_hi = float("nan")
    if ok.sum() >= 2:
        lo, hi = np.quantile(reps[ok], [a, 1 - a], axis=0)
        support = float(np.mean(1 + np.argmax(reps[ok][:, 1:-1], axis=1) == peak))
    t = t[np.isfinite(t)]
    if t.size >= 2:
        t_lo, t_hi = (float(v) for v in np.quantile(t, [a, 1 - a]))
    return Hunchback(profile=profile, low=lo, high=hi, statistic=stat, statistic_low=t_lo, statistic_high=t_hi,
                     raw=raw, peak=peak, peak_support=support, replicates=t, n_points=n, n_units=G, level=level)


def _group_ratios(T: torch.Tensor, D: torch.Tensor, nbr: np.ndarray, near: np.ndarray, label: np.ndarray,
                  rows: np.ndarray) -> np.ndarray:
    """TwoNN ratios of the points ``rows`` among the points of their own label: each point's two nearest
    neighbours with its label, read from its ``K`` nearest of the pooled cloud (``nbr``, their exact
    distances ``near``), else found in its row of ``D``."""
    same = label[nbr[rows]] == label[rows][:, None]
    first = np.argmax(same, axis=1)
    same2 = same.copy()
    same2[np.arange(rows.size), first] = False
    second = np.argmax(same2, axis=1)
    ok = same[np.arange(rows.size), first] & same2[np.arange(rows.size), second]
    r1 = near[rows, first].copy()
    r2 = near[rows, second].copy()
    for i in np.flatnonzero(~ok):  # fewer than two of its own label among its K nearest: the whole row
        row = rows[i]
        d = D[row].clone()
        d[torch.from_numpy(label != label[row])] = math.inf
        d[row] = math.inf
        nn = torch.topk(d, 2, largest=False).indices
        r = sorted(float((T[row] - T[j]).norm()) for j in nn)
        r1[i], r2[i] = r
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = r2 / r1
    mu[(r1 <= 0) | (r1 == r2) | ~np.isfinite(mu)] = np.nan
    return mu


def label_permutation_null(real: Sequence[Any], control: Sequence[Any], *, n_perm: int = 99,
                           discard_fraction: float = 0.1, seed: int = 0, k_pool: int = 48
                           ) -> tuple[float, np.ndarray]:
    """(observed, null): ``T(real) − T(control)`` of the hunchback statistic and its values when the pooled
    sequences are relabelled at random into groups of the original sizes (module docstring). ``real`` and
    ``control``: per-layer matrices, the same layers in both; each group's peak is chosen on its own points,
    as for the observed difference. Compare them with :func:`studies.core.stability.add_one_p`.
    ``k_pool``: pooled neighbours kept per point, among which a point's two nearest of its own group are
    looked for first (the answer does not depend on it)."""
    if len(real) != len(control):
        raise ValueError(f"real and control must hold the same layers; got {len(real)} and {len(control)}")
    n_real = int(as_matrix(real[0], "real").shape[0])
    n_all = n_real + int(as_matrix(control[0], "control").shape[0])
    if min(n_real, n_all - n_real) < 3:
        raise ValueError(f"a permutation null needs at least 3 sequences in each cloud; got {n_real} and "
                         f"{n_all - n_real}")
    rng = np.random.default_rng(seed)
    labels = [np.arange(n_all) < n_real]
    for _ in range(n_perm):
        lab = np.zeros(n_all, dtype=bool)
        lab[rng.permutation(n_all)[:n_real]] = True
        labels.append(lab)
    ids = np.zeros((n_perm + 1, 2, len(real)))
    K = min(int(k_pool), n_all - 1)
    for li, (R, C) in enumerate(zip(real, control)):
        T = _centred(torch.cat([as_matrix(R, "real", dtype=torch.float64, device="cpu"),
                                as_matrix(C, "control", dtype=torch.float64, device="cpu")]))
        D = _distances(T)
        D.fill_diagonal_(math.inf)
        nbr_t = torch.topk(D, K, dim=1, largest=False).indices
        near = np.concatenate([(T[s:s + 256, None, :] - T[nbr_t[s:s + 256]]).norm(dim=2).numpy()
                               for s in range(0, n_all, 256)])
        nbr = nbr_t.numpy()
        for p, lab in enumerate(labels):
            for g, rows in enumerate((np.flatnonzero(lab), np.flatnonzero(~lab))):
                ids[p, g, li] = twonn_dimension(_group_ratios(T, D, nbr, near, lab.astype(np.int8), rows),
                                                discard_fraction)
    diff = np.array([hunchback_statistic(v[0])[0] - hunchback_statistic(v[1])[0] for v in ids])
    return float(diff[0]), diff[1:]
