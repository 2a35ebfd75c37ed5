"""The equi-learning law's summary of a PR-per-layer curve (He & Su 2024).

The law: log PR_l ≈ a + b·l, so every layer multiplies PR by the same decay ratio ρ = 10^b.
Summary of a curve: least-squares slope and intercept of log10 PR on the layer index, ρ, Pearson r
of log PR against layer (He & Su report −0.983 to −0.997), and each layer's share of the total gain,
where layer l's gain is log10 PR_{l−1} − log10 PR_l (the first layer has no predecessor: NaN) and
the shares sum to one over the remaining layers. Equal shares of 1/(L−1) are the law's ideal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PRLawSummary", "pr_law_summary"]


@dataclass(frozen=True)
class PRLawSummary:
    """Fit of log10 PR against layer.

    slope_log10, intercept_log10: least-squares line log10 PR ≈ intercept + slope·layer;
    decay_ratio: ρ = 10^slope; pearson_r: correlation of log PR with layer;
    gain_share (layer,): share of the total log10 gain contributed by each layer (NaN at the first).
    """

    slope_log10: float
    intercept_log10: float
    decay_ratio: float
    pearson_r: float
    gain_share: np.ndarray


def pr_law_summary(layers, pr) -> PRLawSummary:
    """Summarise PR values (layer,) at the given layer indices (layer,)."""
    x = np.asarray(layers, dtype=np.float64).reshape(-1)
    y_raw = np.asarray(pr, dtype=np.float64).reshape(-1)
    if x.shape != y_raw.shape:
        raise ValueError(f"layers and pr: expected equal lengths, got {x.shape[0]} and {y_raw.shape[0]}")
    nan = float("nan")
    if x.size < 2 or not np.all(np.isfinite(y_raw)) or np.any(y_raw <= 0):
        return PRLawSummary(nan, nan, nan, nan, np.full(x.shape, np.nan))
    y = np.log10(y_raw)
    xc, yc = x - x.mean(), y - y.mean()
    sxx, syy = float(xc @ xc), float(yc @ yc)
    slope = float(xc @ yc) / sxx if sxx > 0 else nan
    intercept = float(y.mean() - slope * x.mean())
    r = float(xc @ yc) / np.sqrt(sxx * syy) if sxx > 0 and syy > 0 else nan
    gains = np.concatenate([[np.nan], y[:-1] - y[1:]])
    total = y[0] - y[-1]
    share = gains / total if total != 0 else np.full(x.shape, np.nan)
    return PRLawSummary(float(slope), intercept, float(10.0 ** slope), float(r), share)
