"""Nulls and resampling for the geometry numbers a claim is judged on: the mean cosine of random pairs
(anisotropy) and the linearity score of consecutive layers.

Mean cosine of random pairs (Ethayarajh 2019's anisotropy baseline)
-------------------------------------------------------------------
``mean_cos = (‖Σ u_i‖² − n) / (n (n − 1))`` over the unit rows u_i: the mean cosine over all distinct pairs.

- :func:`unit_sums`: the sums of unit rows per unit (document or window) and the unit sizes, from which
  the mean cosine of any union of units follows (:func:`mean_cosine_of`) — the nested subsamples and the
  document bootstrap (:func:`bootstrap_mean_cosine`) need no second pass over the rows.
- **The isotropic null** (:func:`isotropic_null_draws`): tokens drawn from a zero-mean Gaussian with the
  layer's own per-dimension variances and no correlation. It removes what the paper calls anisotropy — a
  shared direction (the mean) and correlated dimensions, the "narrow cone" — and keeps how unequal the
  dimensions' spreads are, which widens the spread of random cosines without making them positive. Not
  a per-dimension permutation of the tokens: that keeps each dimension's mean, hence the shared direction
  that makes the mean cosine high (its mean cosine ≈ ‖μ‖² / E‖x‖²), so it is no isotropic null. Under
  the Gaussian null the mean cosine has expectation 0 by symmetry at any n; its distribution at n tokens
  is ``(W − 1) / (n − 1)`` with ``W = ‖Σu_i‖² / n`` → ``Σ_k c_k χ²_1`` (the central limit theorem over
  the n independent unit vectors; ``c_k = E[u_k²]``, Σc_k = 1, estimated from ``n_draws`` Gaussian
  vectors), so one set of draws of W serves every n. The null assumes independent tokens.

Linearity score (Razzhigaev et al. 2024)
----------------------------------------
- :func:`permuted_pairing_scores`: the null of "layer l + 1 is a linear map of layer l": token i at
  layer l paired with a random token at layer l + 1 (a permutation of the target rows), scored by the
  same in-sample least-squares fit. Its expectation is rank(X̃) / (n − 1) (a random target's share in
  the span of the source), what an in-sample fit gives any pairing. One eigendecomposition of the
  source's Gram matrix serves every permutation, and each costs one d × n × d product.
- :func:`bootstrap_ratio`: the percentile interval of ``1 − Σ_b R / Σ_b T`` over resampled units, for the
  score with the fitted map held fixed (R: a unit's squared residual, T: its squared normalised target).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .arrays import as_matrix, check_finite_rows
from geometry.linearity import _LeastSquares, _pair

__all__ = ["unit_sums", "mean_cosine_of", "isotropic_null_draws", "null_mean_cosine", "bootstrap_weights",
           "bootstrap_mean_cosine", "permuted_pairing_scores", "bootstrap_ratio", "percentile_interval"]


def unit_sums(X: Any, units: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S, m, var): per unit (``np.unique(units)`` order) the float64 sum of the unit rows of ``X`` [unit, d]
    and the unit's rows [unit]; ``var``: each dimension's variance over all rows [d] (for the null)."""
    T = as_matrix(X, "X", min_rows=2)
    check_finite_rows(T, "X")
    units = np.asarray(units)
    if units.shape != (T.shape[0],):
        raise ValueError(f"units must have one label per row, shape ({T.shape[0]},); got {units.shape}")
    _, inv = np.unique(units, return_inverse=True)
    G = int(inv.max()) + 1
    g = torch.as_tensor(inv.reshape(-1), device=T.device)
    S = torch.zeros((G, T.shape[1]), dtype=torch.float64, device=T.device)
    var_sum = torch.zeros(T.shape[1], dtype=torch.float64, device=T.device)
    mean = T.to(torch.float64).mean(dim=0)
    for a in range(0, T.shape[0], 4096):
        C = T[a:a + 4096].to(torch.float64)
        norms = torch.linalg.vector_norm(C, dim=1, keepdim=True)
        if bool((norms == 0).any()):
            raise ValueError("cosine similarity is undefined for zero vectors; got an all-zero row")
        S.index_add_(0, g[a:a + 4096], C / norms)
        var_sum += ((C - mean) ** 2).sum(dim=0)
    m = np.bincount(inv.reshape(-1), minlength=G).astype(np.float64)
    return S.cpu().numpy(), m, (var_sum / max(1, T.shape[0] - 1)).cpu().numpy()


def mean_cosine_of(S: np.ndarray, m: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray | float:
    """Mean cosine over distinct pairs of the units weighted by ``weights`` ([unit] or [replicate, unit];
    None: every unit once). A unit drawn k times (a bootstrap) counts its own pairs k times and pairs with
    every other unit's copies, but its copies do not pair with each other: those pairs would be within-unit
    pairs passed off as between-unit ones, and would raise the mean cosine of every resample drawing a unit
    twice. With every weight 1: ``(‖Σ u_i‖² − n) / (n (n − 1))``."""
    if weights is None:
        s, n = S.sum(axis=0), float(m.sum())
        return float((s @ s - n) / (n * (n - 1)))
    W = np.asarray(weights, np.float64)
    s = W @ S
    n = W @ m
    extra = W * W - W  # pairs between copies of one unit, per unit
    within = (S * S).sum(axis=1)  # ‖S_g‖²
    with np.errstate(all="ignore"):
        return ((s * s).sum(axis=-1) - extra @ within - n) / (n * n - extra @ (m * m) - n)


def isotropic_null_draws(var: np.ndarray, n_null: int = 999, n_draws: int = 4096, seed: int = 0) -> np.ndarray:
    """``n_null`` draws of W (module docstring) for a zero-mean Gaussian with per-dimension variances ``var``;
    the null's mean cosine at n tokens is ``(W − 1) / (n − 1)``."""
    var = np.asarray(var, np.float64)
    if var.ndim != 1 or not np.all(np.isfinite(var)) or not (var >= 0).all() or not var.sum() > 0:
        raise ValueError("isotropic null: per-dimension variances must be finite, >= 0 and not all 0")
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n_draws, var.size)) * np.sqrt(var)
    U2 = Z * Z / (Z * Z).sum(axis=1, keepdims=True)
    c = U2.mean(axis=0)
    c /= c.sum()
    return rng.chisquare(1, size=(n_null, var.size)) @ c


def null_mean_cosine(draws: np.ndarray, n: float) -> np.ndarray:
    """The null's mean cosine at ``n`` tokens, one per draw of :func:`isotropic_null_draws`."""
    return (np.asarray(draws, np.float64) - 1.0) / (float(n) - 1.0)


def bootstrap_weights(n_units: int, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """[replicate, unit] counts of a bootstrap that resamples whole units with replacement."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=n_boot).astype(np.float64)


def bootstrap_mean_cosine(S: np.ndarray, m: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The mean cosine on each bootstrap replicate of the units (``weights`` from :func:`bootstrap_weights`)."""
    return mean_cosine_of(S, m, weights)


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """(low, high) percentile interval of finite ``values`` (NaN when none)."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    return float(np.quantile(v, a)), float(np.quantile(v, 1 - a))


def bootstrap_ratio(R: np.ndarray, T: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``1 − (W R_p) / (W T_p)`` [replicate, pair] for R, T of shape [pair, unit]: the linearity score of
    each transition on resampled units with the map held fixed."""
    W = np.asarray(weights, np.float64)
    R, T = np.atleast_2d(np.asarray(R, np.float64)), np.atleast_2d(np.asarray(T, np.float64))
    with np.errstate(all="ignore"):
        return 1.0 - (W @ R.T) / (W @ T.T)


def permuted_pairing_scores(X: Any, Y: Any, n_perm: int = 19, seed: int = 0, ridge: float = 0.0) -> np.ndarray:
    """Linearity scores of ``X`` → ``Y[perm]`` for ``n_perm`` random permutations of the target's rows
    (the same normalisation and in-sample least-squares fit as :func:`geometry.linearity.linearity_score`)."""
    Xn, Yn = _pair(X, Y, ridge, None)
    fit = _LeastSquares(Xn, ridge)
    w, lam = fit.w, fit.lam.clamp(min=0)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_perm):
        perm = torch.as_tensor(rng.permutation(Yn.shape[0]), device=Yn.device)
        M = fit.V.T @ (Xn.T @ Yn.index_select(0, perm))  # d × d'
        row = (M * M).sum(dim=1)
        # ‖X̃B − Ỹp‖² = ‖Ỹp‖² − 2 Σ w_k ‖M_k‖² + Σ w_k² λ_k ‖M_k‖², with ‖Ỹp‖² = 1
        rss = 1.0 - 2.0 * float((w * row).sum()) + float((w * w * lam * row).sum())
        out.append(1.0 - rss)
    return np.asarray(out)
