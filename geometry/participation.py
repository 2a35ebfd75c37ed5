"""Participation ratio of a cloud of token states: plain, and corrected for the number of tokens.

Definitions (X is ``(token, d)``; Σ the covariance of the distribution the tokens are drawn from)
------------------------------------------------------------------------------------------------
- ``participation_ratio`` (plain): ``(Σλ)² / Σλ²`` of the eigenvalues λ of the sample covariance, i.e.
  ``tr(C)² / tr(C²)``: a soft count of the directions the variance spreads over (d for an isotropic
  cloud, 1 for a line). With n tokens it is biased low: for an isotropic Gaussian in d dimensions,
  1/PR ≈ 1/n + 1/d, so at n = d the plain value is about d/2 (Chun, Canatar, Chung & Lee, "Estimating
  dimensionality of neural representations from finite samples", ICLR 2026, arXiv 2509.26560).
- ``participation_ratio_corrected``: the ratio of unbiased estimators of (tr Σ)² and tr(Σ²) — the
  row-sampling correction of that paper (their γ_row: every dimension observed, tokens sampled), built
  from U-statistics over distinct tokens with the mean handled through pair differences
  (``tr Σ² = E[((x_i − x_j)·(x_l − x_r))²] / 4`` and ``(tr Σ)² = E[‖x_i − x_j‖² ‖x_l − x_r‖²] / 4`` over
  distinct i, j, l, r). Both reduce to three sums of the centred rows y_i — ``s1 = Σ‖y_i‖²``,
  ``s2 = Σ‖y_i‖⁴`` and ``b = ‖YᵀY‖²_F`` — so nothing n × n is formed:

      tr Σ²  ≈ [(n − 2) b + s1² / (n − 1) − n s2] / [n (n − 2)(n − 3)]
      (tr Σ)² ≈ [(n² − 3n + 1) s1² − n (n − 1) s2 + 2 b] / [n (n − 1)(n − 2)(n − 3)]

  (the first is Himeno & Yamada's 2014 estimator; both equal the brute-force U-statistics exactly:
  tests/geometry/test_geometry_nulls.py). It assumes independent tokens; tokens of one document are
  not, which the correction does not see. Built from products of distinct tokens only, it gives no weight
  to one token's own square: a single token of massive norm (an attention sink outside position 0) can make
  the plain ratio ≈ 1 — one direction holding nearly all the sample's variance — while the corrected one,
  which cannot tell a direction from one sample, stays near the rest's (SmolLM2, 4000 tokens, middle layers:
  plain ≈ 1.1–1.5, corrected ≈ 45–75, one token of norm ≈ 24 000 among norms ≈ 120). Read the two together.
"""

from __future__ import annotations

from typing import Any

import torch

from .arrays import as_matrix, check_finite_rows

__all__ = ["spectral_sums", "participation_ratio", "participation_ratios", "participation_from_sums"]

_CHUNK = 4096


def spectral_sums(X: Any) -> tuple[int, float, float, float]:
    """(n, s1, s2, b) of the centred rows of ``X``: Σ‖y‖², Σ‖y‖⁴ and ‖YᵀY‖²_F (float64 sums of float32
    chunk products about the mean — centring first keeps the variance from cancelling against the mean)."""
    T = as_matrix(X, "X", min_rows=4)
    check_finite_rows(T, "X")
    n, d = T.shape
    mean = T.to(torch.float64).mean(dim=0) if T.dtype != torch.float64 else T.mean(dim=0)
    work = torch.float64 if T.dtype == torch.float64 else torch.float32
    m = mean.to(work)
    G = torch.zeros((d, d), dtype=torch.float64, device=T.device)
    s1 = s2 = 0.0
    for a in range(0, n, _CHUNK):
        Y = T[a:a + _CHUNK].to(work) - m
        G += (Y.T @ Y).to(torch.float64)
        g = (Y.to(torch.float64) ** 2).sum(dim=1)
        s1 += float(g.sum())
        s2 += float((g * g).sum())
    return n, s1, s2, float((G * G).sum())


def participation_from_sums(n: int, s1: float, s2: float, b: float) -> tuple[float, float]:
    """(plain, corrected) participation ratio from :func:`spectral_sums` (NaN where undefined)."""
    nan = float("nan")
    plain = s1 * s1 / b if b > 0 else nan
    if n < 4:
        return plain, nan
    tr2 = ((n - 2) * b + s1 * s1 / (n - 1) - n * s2) / (n * (n - 2) * (n - 3))
    sq = ((n * n - 3 * n + 1) * s1 * s1 - n * (n - 1) * s2 + 2 * b) / (n * (n - 1) * (n - 2) * (n - 3))
    corrected = sq / tr2 if tr2 > 0 else nan
    return plain, corrected


def participation_ratios(X: Any) -> tuple[float, float]:
    """(plain, corrected) participation ratio of ``X`` (see the module docstring)."""
    return participation_from_sums(*spectral_sums(X))


def participation_ratio(X: Any, corrected: bool = False) -> float:
    """The participation ratio of ``X``'s covariance; ``corrected``: the finite-sample correction."""
    plain, corr = participation_ratios(X)
    return corr if corrected else plain
