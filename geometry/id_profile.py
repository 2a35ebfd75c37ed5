"""Intrinsic dimension per layer, with a subsampling interval.

The interval is built by re-estimating on ``n_bootstrap`` random subsets of ``subsample`` distinct
tokens, drawn *without* replacement. Ordinary bootstrap resampling (with replacement) would create
duplicate points, which have zero nearest-neighbour distance and break TwoNN and MLE; subsampling
("m-out-of-n bootstrap") avoids that. The same token subsets are used at every layer, so the
differences between layers are paired. Note that ID estimates depend somewhat on the number of
points (the scale they probe), so the interval describes the estimate at ``subsample`` points;
``dimension_boot`` (the median over subsets) is the point estimate on that same footing, while
``dimension`` is the estimate on all (or ``max_points``) tokens.

Several estimators at once (:func:`intrinsic_dims_by_layer`) share the work: on every point set
(each layer's full sample and each subset) one neighbour graph, with as many neighbours as the
most demanding estimator reads, serves every estimator that can read one (TwoNN, MLE); others
(scikit-dimension's) fit on the points themselves.
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
from .intrinsic_dim import make_estimator, uses_neighbor_graph
from .neighbors import neighbor_graph

__all__ = ["LayerIntrinsicDim", "intrinsic_dim_by_layer", "intrinsic_dims_by_layer"]

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
    name = estimator if isinstance(estimator, str) else type(estimator).__name__
    return intrinsic_dims_by_layer(states, {name: estimator}, layers=layers, subsample=subsample,
                                   n_bootstrap=n_bootstrap, confidence=confidence, max_points=max_points,
                                   seed=seed, progress=progress)[name]


def _fit_all(bases: dict, X) -> dict:
    """Fit every estimator on the points ``X``; those that read a neighbour graph share one."""
    graph_ests = {k: e for k, e in bases.items() if uses_neighbor_graph(e)}
    out = {}
    if graph_ests:
        lead = max(graph_ests.values(), key=lambda e: e.neighbors_needed)
        k = lead.neighbors_needed
        graph = neighbor_graph(X, k, min_points=max(3, k + 1), what=lead.graph_what, device=lead.device,
                               chunk_size=lead.chunk_size, precision=getattr(lead, "precision", "auto"))
        for key, est in graph_ests.items():
            out[key] = clone(est).fit_graph(graph)
    for key, est in bases.items():
        if key not in out:
            out[key] = clone(est).fit(X)
    return out


def _layer_matrices(states: Any, layers: Sequence[int] | None) -> tuple[list[int], Any, bool]:
    """(layer labels, the per-layer matrices, whether they are a lazy lens LayerView), every layer checked to
    hold the same tokens."""
    # a lens LayerView (lazy, with .take): only the rows the fits use are read, one layer at a time
    lazy = hasattr(states, "take") and hasattr(states, "n_tokens") and hasattr(states, "layers")
    if lazy:
        keys = [int(k) for k in (states.layers if layers is None else layers)]
        if len(keys) != len(states):
            raise ValueError(f"got {len(keys)} layer labels for {len(states)} state matrices")
        mats = states
    else:
        keys, mats = _as_layer_list(states, layers)
    if not len(mats):
        raise ValueError("states must hold at least one layer; got none")
    n = int(states.n_tokens) if lazy else int(mats[0].shape[0])
    for k, M in zip(keys, () if lazy else mats):
        if int(M.shape[0]) != n:
            raise ValueError(f"every layer must hold the same tokens; layer {keys[0]} has {n}, layer {k} has {M.shape[0]}")
    return keys, mats, lazy


def intrinsic_dims_by_layer(
    states: Any,
    estimators: Mapping[str, str | BaseEstimator],
    *,
    layers: Sequence[int] | None = None,
    subsample: int | None = None,
    n_bootstrap: int = 20,
    confidence: float = 0.9,
    max_points: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, LayerIntrinsicDim]:
    """:func:`intrinsic_dim_by_layer` for several estimators at once, ``{name: estimator}`` →
    ``{name: LayerIntrinsicDim}``, on the same subsets, sharing one neighbour graph per point set
    among the estimators that read one (module docstring). Each result equals the one
    :func:`intrinsic_dim_by_layer` gives for that estimator alone with the same arguments."""
    keys, mats, lazy = _layer_matrices(states, layers)
    if not estimators:
        raise ValueError("estimators must name at least one estimator; got none")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0; got {n_bootstrap}")
    n = int(states.n_tokens) if lazy else int(mats[0].shape[0])
    sub = n // 2 if subsample is None else int(subsample)
    if n_bootstrap and not 3 <= sub <= n:
        raise ValueError(f"subsample must be between 3 and the number of tokens ({n}); got {sub}")

    bases = {name: make_estimator(e) if isinstance(e, str) else e for name, e in estimators.items()}
    rng = np.random.default_rng(seed)
    full_idx = None
    if max_points is not None and max_points < n:
        full_idx = np.sort(rng.choice(n, size=max_points, replace=False))
    subsets = [np.sort(rng.choice(n, size=sub, replace=False)) for _ in range(n_bootstrap)]
    if lazy and full_idx is not None:  # read the union of the rows drawn, and index into it
        used = np.unique(np.concatenate([full_idx, *subsets]))
        mats = states.take(used)
        full_idx = np.searchsorted(used, full_idx)
        subsets = [np.searchsorted(used, s) for s in subsets]

    L = len(mats)
    dim = {name: np.full(L, np.nan) for name in bases}
    reps = {name: np.full((L, n_bootstrap), np.nan) for name in bases}
    n_dup = {name: np.zeros(L, dtype=np.int64) for name in bases}
    bar = tqdm(total=L * (1 + n_bootstrap), desc=f"ID ({', '.join(bases)})", disable=not progress)
    for li, M in enumerate(mats):
        X = as_matrix(M, f"states[{keys[li]}]")
        for name, est in _fit_all(bases, X if full_idx is None else X[full_idx]).items():
            dim[name][li] = est.dimension_
            n_dup[name][li] = getattr(est, "n_duplicates_", 0)
        bar.update(1)
        for b, idx in enumerate(subsets):
            for name, est in _fit_all(bases, X[idx]).items():
                reps[name][li, b] = est.dimension_
            bar.update(1)
    bar.close()
    alpha = (1.0 - confidence) / 2.0
    out = {}
    for name in bases:
        if n_bootstrap:
            low, high = np.quantile(reps[name], [alpha, 1.0 - alpha], axis=1)
            boot = np.median(reps[name], axis=1)
        else:
            low = high = boot = np.full(L, np.nan)
        out[name] = LayerIntrinsicDim(
            layers=np.asarray(keys, dtype=np.int64), dimension=dim[name], dimension_boot=boot, low=low, high=high,
            replicates=reps[name], n_duplicates=n_dup[name], estimator=name, subsample=sub, confidence=confidence)
    return out
