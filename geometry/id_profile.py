"""Intrinsic dimension per layer, with a subsampling interval.

The interval is built by re-estimating on ``n_bootstrap`` random subsets of ``subsample`` distinct
tokens, drawn *without* replacement. Ordinary bootstrap resampling (with replacement) would create
duplicate points, which have zero nearest-neighbour distance and break TwoNN and MLE; subsampling
("m-out-of-n bootstrap") avoids that. The same token subsets are used at every layer, so the
differences between layers are paired. Note that ID estimates depend somewhat on the number of
points (the scale they probe), so the interval describes the estimate at ``subsample`` points;
``dimension_boot`` (the median over subsets) is the point estimate on that same footing, while
``dimension`` is the estimate on all (or ``max_points``) tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, clone
from tqdm.auto import tqdm

from .arrays import as_matrix
from .intrinsic_dim import make_estimator

__all__ = ["LayerIntrinsicDim", "intrinsic_dim_by_layer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerIntrinsicDim:
    """Intrinsic dimension per layer.

    Attributes (axes in brackets)
    -----------------------------
    layers : [layer] int, layer labels in the order given.
    dimension : [layer] estimate on all tokens (or a fixed ``max_points`` subset).
    dimension_boot : [layer] median of the subsample estimates.
    low, high : [layer] lower / upper percentile bounds of the subsample estimates.
    replicates : [layer, replicate] every subsample estimate.
    n_duplicates : [layer] duplicate rows dropped in the full-sample fit.
    estimator : name of the estimator. subsample : points per subset. confidence : interval level.
    """

    layers: np.ndarray
    dimension: np.ndarray
    dimension_boot: np.ndarray
    low: np.ndarray
    high: np.ndarray
    replicates: np.ndarray
    n_duplicates: np.ndarray
    estimator: str
    subsample: int
    confidence: float


def _as_layer_list(states: Any, layers: Sequence[int] | None) -> tuple[list[int], list[Any]]:
    if isinstance(states, Mapping):
        keys = list(states.keys()) if layers is None else list(layers)
        missing = [k for k in keys if k not in states]
        if missing:
            raise ValueError(f"layers {missing} are not in states; available: {sorted(states)}")
        return [int(k) for k in keys], [states[k] for k in keys]
    if hasattr(states, "ndim") and states.ndim == 3:
        seq = [states[i] for i in range(states.shape[0])]
    else:
        seq = list(states)
    keys = list(range(len(seq))) if layers is None else list(layers)
    if len(keys) != len(seq):
        raise ValueError(f"got {len(keys)} layer labels for {len(seq)} state matrices")
    return [int(k) for k in keys], seq


def intrinsic_dim_by_layer(
    states: Any,
    estimator: str | BaseEstimator = "twonn",
    *,
    layers: Sequence[int] | None = None,
    subsample: int | None = None,
    n_bootstrap: int = 20,
    confidence: float = 0.9,
    max_points: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> LayerIntrinsicDim:
    """Estimate the intrinsic dimension of each layer's token states, with a subsampling interval.

    Parameters
    ----------
    states : a sequence of ``(n_tokens, d_model)`` matrices (one per layer, same tokens), a
        ``(layer, token, d_model)`` array, or a mapping ``{layer: matrix}``.
    estimator : ``"twonn"``, ``"mle"``, any scikit-dimension name, or an estimator instance
        (cloned for every fit).
    layers : labels for the layers (defaults to ``0..L-1`` or the mapping's keys).
    subsample : points per subset for the interval (default: half the tokens).
    n_bootstrap : number of subsets (0 disables the interval; ``low``/``high`` are then NaN).
    confidence : central interval level, e.g. 0.9 gives the 5th–95th percentiles.
    max_points : cap on the points used for ``dimension`` (a fixed random subset).
    seed : seeds the subsets.
    """
    keys, mats = _as_layer_list(states, layers)
    if not mats:
        raise ValueError("states must hold at least one layer; got none")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0; got {n_bootstrap}")
    n = int(mats[0].shape[0])
    for k, M in zip(keys, mats):
        if int(M.shape[0]) != n:
            raise ValueError(f"every layer must hold the same tokens; layer {keys[0]} has {n}, layer {k} has {M.shape[0]}")
    sub = n // 2 if subsample is None else int(subsample)
    if n_bootstrap and not 3 <= sub <= n:
        raise ValueError(f"subsample must be between 3 and the number of tokens ({n}); got {sub}")

    base = make_estimator(estimator) if isinstance(estimator, str) else estimator
    name = estimator if isinstance(estimator, str) else type(estimator).__name__
    rng = np.random.default_rng(seed)
    full_idx = None
    if max_points is not None and max_points < n:
        full_idx = np.sort(rng.choice(n, size=max_points, replace=False))
    subsets = [np.sort(rng.choice(n, size=sub, replace=False)) for _ in range(n_bootstrap)]

    dim = np.full(len(mats), np.nan)
    reps = np.full((len(mats), n_bootstrap), np.nan)
    n_dup = np.zeros(len(mats), dtype=np.int64)
    bar = tqdm(total=len(mats) * (1 + n_bootstrap), desc=f"ID ({name})", disable=not progress)
    for li, M in enumerate(mats):
        X = as_matrix(M, f"states[{keys[li]}]")
        est = clone(base).fit(X if full_idx is None else X[full_idx])
        dim[li] = est.dimension_
        n_dup[li] = getattr(est, "n_duplicates_", 0)
        bar.update(1)
        for b, idx in enumerate(subsets):
            reps[li, b] = clone(base).fit(X[idx]).dimension_
            bar.update(1)
    bar.close()
    alpha = (1.0 - confidence) / 2.0
    if n_bootstrap:
        low, high = np.quantile(reps, [alpha, 1.0 - alpha], axis=1)
        boot = np.median(reps, axis=1)
    else:
        low = high = boot = np.full(len(mats), np.nan)
    return LayerIntrinsicDim(
        layers=np.asarray(keys, dtype=np.int64),
        dimension=dim,
        dimension_boot=boot,
        low=low,
        high=high,
        replicates=reps,
        n_duplicates=n_dup,
        estimator=name,
        subsample=sub,
        confidence=confidence,
    )
