"""Exact duplicate rows of a point cloud: row hashes, their removal, and the checks before a kNN search
(:func:`prepare_points`: finite rows, enough distinct points)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from geometry import _scan

from .arrays import as_matrix, check_finite_rows
from .knn_tiles import _compiled

log = logging.getLogger("geometry.neighbors")  # the search's logger, as before the cut


_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


def row_hashes(X: torch.Tensor, chunk_size: int = 4096) -> torch.Tensor:
    """A 64-bit hash of each row's exact bit pattern (``-0.0`` counted as ``0.0``), computed chunk
    by chunk so no full-size temporary is made. Integer arithmetic wraps, so it is exact and
    independent of summation order: identical rows always get identical hashes."""
    n, d = X.shape
    w = _hash_weights(d, X.device)
    out = torch.empty(n, dtype=torch.int64, device=X.device)
    for s in range(0, n, chunk_size):
        bits = (X[s : s + chunk_size] + 0.0).contiguous().view(_INT_VIEW[X.dtype]).to(torch.int64)
        out[s : s + chunk_size] = (bits * w).sum(dim=1)
    return out


def _hash_weights(d: int, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0x5EED)
    return torch.randint(-(2**62), 2**62, (d,), generator=gen, dtype=torch.int64).to(device) | 1


def _hashes_and_finite(X: torch.Tensor):
    """``(row_hashes(X), all-finite flag per row)`` from one compiled pass (CPU, float32/float64),
    or None where that pass does not apply."""
    if not (_compiled(X.device) and X.dtype in (torch.float32, torch.float64) and X.is_contiguous()):
        return None

    n, d = X.shape
    bits = X.numpy().view(np.int64 if X.dtype == torch.float64 else np.int32)
    sign = -(2**63) if X.dtype == torch.float64 else -(2**31)
    h = torch.empty(n, dtype=torch.int64)
    finite = torch.empty(n, dtype=torch.bool)
    _scan.hash_rows(bits, _hash_weights(d, "cpu").numpy(), sign, h.numpy(), finite.numpy())
    return h, finite


def drop_duplicates(X: torch.Tensor, hashes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop exact duplicate rows, keeping the first copy and the original order.

    Returns ``(X_unique, kept_index)`` where ``kept_index`` indexes the rows of ``X`` that were kept.
    Duplicate points have zero distance to a neighbour, which makes TwoNN's ratio r2/r1 infinite and
    MLE's log(r_k/r_j) infinite; they carry no information about the manifold's dimension.
    Rows are grouped by :func:`row_hashes` (O(n) memory, unlike sorting whole rows) and a row is a
    duplicate only if it equals its group's first row exactly.
    """
    n = X.shape[0]
    dev = X.device
    h = row_hashes(X) if hashes is None else hashes  # ``hashes``: row_hashes(X), already computed
    order = torch.argsort(h, stable=True)  # stable: the first member of a group has the lowest index
    hs = h[order]
    new_group = torch.ones(n, dtype=torch.bool, device=dev)
    new_group[1:] = hs[1:] != hs[:-1]
    if bool(new_group.all()):
        return X, torch.arange(n, device=dev)
    pos = torch.arange(n, device=dev)
    group_first = torch.cummax(torch.where(new_group, pos, torch.zeros_like(pos)), dim=0).values
    cand = torch.nonzero(~new_group).flatten()
    rows, firsts = order[cand], order[group_first[cand]]
    dup = torch.zeros(n, dtype=torch.bool, device=dev)
    for s in range(0, cand.numel(), 4096):  # exact check, chunked (hash collisions are not dropped)
        r, f = rows[s : s + 4096], firsts[s : s + 4096]
        dup[r] = (X[r] == X[f]).all(dim=1)
    kept = torch.nonzero(~dup).flatten()
    return (X, kept) if kept.numel() == n else (X[kept], kept)



def prepare_points(
    X: Any, *, min_points: int, what: str, device: str | torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Validate ``X``, drop duplicate rows, and check enough distinct points remain.

    Returns ``(X_unique, kept_index, n_duplicates)``. Raises ``ValueError`` for non-2-D input, rows
    holding NaN/inf, a single repeated point, or fewer than ``min_points`` distinct points.
    """
    T = as_matrix(X, "X", device=device)
    if T.dtype in (torch.float16, torch.bfloat16):
        T = T.to(torch.float32)
    fused = _hashes_and_finite(T)  # one compiled pass where it applies, else two torch passes
    if fused is None or not bool(fused[1].all()):
        check_finite_rows(T, "X")
    n = T.shape[0]
    U, kept = drop_duplicates(T, None if fused is None else fused[0])
    n_dup = n - U.shape[0]
    if n > 1 and U.shape[0] == 1:
        raise ValueError(
            f"{what} needs distinct points; got {n} rows that are all the same point "
            "(intrinsic dimension is undefined)"
        )
    if U.shape[0] < min_points:
        dup = f" after dropping {n_dup} duplicate row(s)" if n_dup else ""
        raise ValueError(
            f"{what} needs at least {min_points} distinct points; got {U.shape[0]}{dup}"
        )
    if n_dup:
        log.info("%s: dropped %d duplicate row(s) of %d", what, n_dup, n)
    return U, kept, n_dup
