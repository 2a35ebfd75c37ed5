"""Post-processing of token states under which every geometry metric can be recomputed.

Timkey & van Schijndel (2021) show that a handful of rogue dimensions dominate cosine similarity and
that simple post-processing (standardisation) removes the effect; isotropy papers whiten or remove
the top directions. Each function here maps a ``(token, d_model)`` matrix to a new one, fitted on
the same matrix (transductive), returning float64 on the input's device.

- ``standardize``: z-score every dimension (mean 0, std 1 over tokens).
- ``zca_whiten``: ZCA whitening, (X − μ) C^{-1/2} with eigenvalues regularised by
  ``eps × mean eigenvalue``; unlike PCA whitening it stays closest to the original axes.
- ``remove_dims`` / ``remove_top_dims``: delete columns, e.g. the top-k rogue dimensions by
  contribution to the mean cosine (or by variance).
- ``clip_outliers``: clamp all entries to median ± n_sigma × robust std of *all* entries (the
  robust std is 1.4826 × the median absolute deviation), which cuts the few huge outlier values
  without touching the bulk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .arrays import as_matrix, check_finite_rows, lapack_threads
from .outliers import cosine_contributions

__all__ = [
    "POSTPROCESSING", "standardize", "zca_whiten", "remove_dims", "remove_top_dims", "clip_outliers",
    "postprocess",
]  # fmt: skip

#: Names accepted by :func:`postprocess`, "raw" meaning unchanged.
POSTPROCESSING = ("raw", "standardize", "whiten", "remove_top", "clip")


def _load(X: Any) -> torch.Tensor:
    T = as_matrix(X, "X", dtype=torch.float64, min_rows=2)
    check_finite_rows(T, "X")
    return T


def standardize(X: Any, eps: float = 1e-12) -> torch.Tensor:
    """Per-dimension z-score; constant dimensions become 0."""
    T = _load(X)
    sd = T.std(dim=0, keepdim=True)
    return (T - T.mean(dim=0, keepdim=True)) / torch.where(sd > eps, sd, torch.ones_like(sd))


def zca_whiten(X: Any, eps: float = 1e-6) -> torch.Tensor:
    """ZCA whitening: centred X times C^{-1/2}, eigenvalues floored at ``eps × mean eigenvalue``."""
    T = _load(X)
    Xc = T - T.mean(dim=0, keepdim=True)
    C = Xc.T @ Xc / (Xc.shape[0] - 1)
    with lapack_threads(C.device):
        evals, evecs = torch.linalg.eigh(C)
    floor = eps * float(evals.clamp(min=0).mean())
    inv_sqrt = 1.0 / torch.sqrt(evals.clamp(min=0) + max(floor, 1e-300))
    return Xc @ (evecs * inv_sqrt) @ evecs.T


def remove_dims(X: Any, dims: Sequence[int]) -> torch.Tensor:
    """Delete the given columns."""
    T = _load(X)
    d = T.shape[1]
    dims = [int(i) for i in dims]
    bad = [i for i in dims if not -d <= i < d]
    if bad:
        raise ValueError(f"dims must index the {d} columns; got out-of-range {bad}")
    keep = torch.ones(d, dtype=torch.bool, device=T.device)
    keep[torch.as_tensor(dims, dtype=torch.long, device=T.device)] = False
    if not bool(keep.any()):
        raise ValueError(f"cannot remove all {d} dimensions")
    return T[:, keep]


def remove_top_dims(X: Any, k: int = 3, by: str = "cosine") -> tuple[torch.Tensor, np.ndarray]:
    """Remove the top-``k`` dimensions ranked ``by`` "cosine" contribution or "variance".

    Returns ``(X_without, removed_dims)``.
    """
    T = _load(X)
    if by == "cosine":
        score = cosine_contributions(T)
    elif by == "variance":
        score = T.var(dim=0).cpu().numpy()
    else:
        raise ValueError(f"by must be 'cosine' or 'variance'; got {by!r}")
    if not 0 <= k < T.shape[1]:
        raise ValueError(f"k must be between 0 and d_model - 1 = {T.shape[1] - 1}; got {k}")
    top = np.argsort(-score, kind="stable")[:k]
    return remove_dims(T, top), top.astype(np.int64)


def clip_outliers(X: Any, n_sigma: float = 6.0) -> torch.Tensor:
    """Clamp every entry to median ± n_sigma × 1.4826 × MAD of all entries."""
    if n_sigma <= 0:
        raise ValueError(f"n_sigma must be > 0; got {n_sigma}")
    T = _load(X)
    flat = T.flatten()
    if flat.numel() > 4_000_000:  # a strided sample is plenty for two quantiles
        flat = flat[:: flat.numel() // 4_000_000 + 1]
    med = flat.median()
    mad = (flat - med).abs().median() * 1.4826
    if float(mad) == 0.0:
        return T.clone()
    return T.clamp(min=float(med - n_sigma * mad), max=float(med + n_sigma * mad))


def postprocess(X: Any, name: str, *, k: int = 3, n_sigma: float = 6.0) -> torch.Tensor:
    """Apply one of :data:`POSTPROCESSING` by name (``k`` for "remove_top", ``n_sigma`` for "clip")."""
    if name == "raw":
        return _load(X)
    if name == "standardize":
        return standardize(X)
    if name == "whiten":
        return zca_whiten(X)
    if name == "remove_top":
        return remove_top_dims(X, k=k)[0]
    if name == "clip":
        return clip_outliers(X, n_sigma=n_sigma)
    raise ValueError(f"unknown post-processing {name!r}; expected one of {POSTPROCESSING}")
