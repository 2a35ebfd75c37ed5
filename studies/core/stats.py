"""Interval estimates the studies share: bootstraps that resample whole groups (documents, windows,
chunks), because tokens of one group are not independent draws."""

from __future__ import annotations

import numpy as np


def bootstrap_group_means(sums, counts, n_boot: int = 200, seed: int = 0, level: float = 0.95):
    """Percentile interval of a ratio-of-sums mean with whole groups resampled.

    ``sums`` and ``counts``: (..., group) per-group totals and token counts; each resample draws the
    groups with replacement and takes Σ sums / Σ counts. Returns (low, high) of shape (...)."""
    sums, counts = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    G = sums.shape[-1]
    w = np.random.default_rng(seed).multinomial(G, np.full(G, 1.0 / G), size=n_boot).T  # (group, boot)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (sums @ w) / (counts @ w)  # (..., boot)
    a = (1 - level) / 2
    return np.nanquantile(means, a, axis=-1), np.nanquantile(means, 1 - a, axis=-1)


def group_bootstrap_mean(values: np.ndarray, groups: np.ndarray, n_boot: int = 200, seed: int = 0,
                         level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of the mean of ``values`` (layer, token; NaN = not scored) with whole
    ``groups`` (documents or windows) resampled: (low, high) per layer."""
    sums, counts = unit_sums(values, groups)
    return bootstrap_group_means(sums, counts, n_boot, seed, level)


def unit_sums(values: np.ndarray, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per layer and unit: the sum of ``values`` (layer, token; NaN = not scored) and the count of scored tokens,
    (layer, unit) each, units numbered in sorted order."""
    values = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(values)
    codes = np.unique(np.asarray(units), return_inverse=True)[1].reshape(-1)
    G = int(codes.max()) + 1 if codes.size else 0
    sums = np.stack([np.bincount(codes, weights=np.where(o, v, 0.0), minlength=G) for v, o in zip(values, ok)])
    counts = np.stack([np.bincount(codes, weights=o.astype(float), minlength=G) for o in ok])
    return sums, counts


def profile_interval(statistic, arrays, units: np.ndarray, n_boot: int = 200, seed: int = 0,
                     level: float = 0.95) -> tuple[float | None, float | None]:
    """Percentile interval of ``statistic(*profiles)`` — a number from per-layer mean profiles, one per array of
    ``arrays`` (layer, token; NaN = not scored) — with whole ``units`` (documents or windows) resampled: each
    resample draws the units with replacement (the same draw for every array), takes each layer's mean over the
    drawn tokens and the statistic of those profiles. (None, None) when no resample gives a number."""
    parts = [unit_sums(a, units) for a in arrays]
    G = parts[0][0].shape[1]
    if G == 0:
        return None, None
    w = np.random.default_rng(seed).multinomial(G, np.full(G, 1.0 / G), size=n_boot).T  # (unit, boot)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = [(s @ w) / (c @ w) for s, c in parts]  # (layer, boot) each
    stats = []
    for b in range(n_boot):
        v = statistic(*(m[:, b] for m in means))
        if v is not None and np.isfinite(v):
            stats.append(float(v))
    if not stats:
        return None, None
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))
