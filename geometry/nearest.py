"""The k nearest tokens of a few query tokens in one layer: exact, on the states' device, chunk by chunk.

This answers the explorer's "which corpus tokens sit nearest this one at layer l?" for one or a few
query rows against a whole layer. :func:`geometry.knn` answers a different question (every point's
neighbours, a symmetric n × n search with certified low-precision candidates); a handful of queries
needs none of that machinery: every distance is computed directly, in float64.

Conventions
-----------
- Row indices (``queries``, ``eligible``, the returned ``rows``) index the states' ``token`` axis:
  the tensor's rows, or a :class:`lens.store.views.LayerView`'s tokens (store rows for a view that was
  not ``take``-n; restrict candidates with ``eligible=store.mask(...)`` rather than ``take`` to keep
  store rows throughout).
- ``cosine`` distance is ``1 − cos(x, q)``, in [0, 2]; a candidate row of zero norm has cosine 0 with
  everything (distance 1, as in scikit-learn); a query of zero norm is refused. ``euclidean`` is
  ``‖x − q‖``. Both are computed from the stored values in float64 (float32 on Apple's MPS, which
  has no float64) as a direct sum over dimensions
  (no ``‖x‖² + ‖q‖² − 2x·q`` expansion, whose cancellation a large common offset would expose), so
  equal rows get bit-equal distances wherever they sit.
- A query is never its own neighbour (``exclude_self``); its exact duplicates are, at distance 0.
- Ties are broken by row: the lower row comes first, whatever the chunk size or device.
- Memory: the layer stays where it is (a store held on a GPU is read there; nothing of the layer is
  copied to the host); each step converts ``chunk_size`` (query, row) pairs' worth of rows to float64,
  so the extra memory is about ``3 × chunk_size × d_model × 8`` bytes. Only the (query, k) answer
  comes to the host, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from contextlib import nullcontext

import numpy as np
import torch

from lens.errors import LensInputError

from .arrays import as_matrix
from lens.store.views import LayerView
from lens.runtime.threads import serial

__all__ = ["METRICS", "Nearest", "nearest"]

METRICS = ("cosine", "euclidean")


@dataclass(frozen=True)
class Nearest:
    """The k nearest eligible rows of each query row.

    queries : (query,) int64, the query rows.
    rows : (query, neighbour) int64, each query's nearest rows, nearest first (ties: lower row first).
    distances : (query, neighbour) float64, ascending along ``neighbour``: ``1 − cos`` for ``cosine``,
        ``‖x − q‖`` for ``euclidean``.
    metric : the metric, one of :data:`METRICS`.
    n_candidates : (query,) int64, the rows each query's list was chosen from (eligible, itself left out).
    """

    queries: np.ndarray
    rows: np.ndarray
    distances: np.ndarray
    metric: str
    n_candidates: np.ndarray

    @property
    def k(self) -> int:
        return int(self.rows.shape[1])


def _layer_of(states, layer: int | None) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(the layer's tensor as stored, the view's row indices on its device or None, number of rows)."""
    if isinstance(states, LayerView):
        if not states.site.per_layer:  # embed, final_norm: one position, read with layer None
            if layer is not None:
                raise LensInputError(f"nearest: {states.site.value} has no layers; got layer={layer}")
        elif layer is None and len(states.layers) != 1:
            raise LensInputError(f"nearest: this view holds layers {states.layers}; expected layer= to say which one")
        elif layer is None:
            layer = states.layers[0]
        elif layer not in states.layers:
            raise LensInputError(f"nearest: layer {layer} is not in this view (it has {states.layers})")
        X = states.store.get(layer=layer, site=states.site)  # a held store's own tensor: no copy
        rows = None if states.rows is None else torch.as_tensor(states.rows, device=X.device)
        return X, rows, states.n_tokens
    if layer is not None:
        raise LensInputError("nearest: layer= is for a store LayerView; got a single (token, d_model) array")
    try:
        X = as_matrix(states, "states")
    except ValueError as exc:
        raise LensInputError(f"nearest: {exc}") from None
    return X, None, int(X.shape[0])


def _index_array(values, n: int, what: str) -> np.ndarray:
    idx = np.atleast_1d(np.asarray(values))
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise LensInputError(f"nearest: {what} must be one row index or a list of them; got {values!r}")
    bad = idx[(idx < 0) | (idx >= n)]
    if bad.size:
        raise LensInputError(f"nearest: {what} must be rows 0..{n - 1}; got {bad[:5].tolist()}")
    return idx.astype(np.int64)


def _eligible_mask(eligible, n: int) -> np.ndarray:
    if eligible is None:
        return np.ones(n, dtype=bool)
    e = np.asarray(eligible)
    if e.dtype == bool:
        if e.shape != (n,):
            raise LensInputError(f"nearest: eligible must be a boolean mask of {n} rows; got shape {e.shape}")
        return e
    mask = np.zeros(n, dtype=bool)
    mask[_index_array(e, n, "eligible")] = True
    return mask


#: (query, row, dimension) triples below which a CPU query runs on one thread: each step is a few small
#: element-wise ops, and on a busy machine every parallel op waits at its barrier for a descheduled
#: worker (measured on 2 shared cores with a capture running: 600 × 64 took 160 ms on the pool, 1.4 ms
#: on one thread). About 0.2 s of single-threaded work.
_SERIAL_WORK = 1 << 28


def _pool_for(device: torch.device, work: int):
    return serial(device) if device.type == "cpu" and work <= _SERIAL_WORK else nullcontext()


def _work_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


@torch.no_grad()
def _search(X, rows, queries: torch.Tensor, keep: torch.Tensor, k: int, metric: str, exclude_self: bool,
            chunk_size: int):
    """The search on X's device: (distances (query, k), rows (query, k), flags) as device tensors.

    ``flags`` = [queries holding NaN/inf, queries of zero norm (cosine), eligible rows whose distance
    to the first query is not finite]; reading them is the caller's one host synchronisation."""
    dev, work = X.device, _work_dtype(X.device)
    n, m = keep.shape[0], queries.shape[0]

    def take(idx_or_slice):
        if rows is None:
            return X[idx_or_slice]
        return X.index_select(0, rows[idx_or_slice])

    Q = take(queries).to(work)
    bad_query = (~torch.isfinite(Q)).any(dim=1).sum()
    if metric == "cosine":
        qn = torch.linalg.vector_norm(Q, dim=1, keepdim=True)
        zero_query = (qn == 0).sum()
        Q = Q / torch.where(qn > 0, qn, torch.ones_like(qn))
    else:
        zero_query = torch.zeros((), dtype=torch.long, device=dev)
    best_d = torch.full((m, k), float("inf"), dtype=work, device=dev)
    best_i = torch.full((m, k), -1, dtype=torch.long, device=dev)
    bad_rows = torch.zeros((), dtype=torch.long, device=dev)
    step = max(1, chunk_size // m)  # rows per step: chunk_size (query, row) pairs
    for s in range(0, n, step):
        e = min(s + step, n)
        C = take(slice(s, e)).to(work)
        if metric == "cosine":
            cn = torch.linalg.vector_norm(C, dim=1)
            cn = torch.where(cn > 0, cn, torch.ones_like(cn))  # a zero row: dot 0, cosine 0
            D = (C.unsqueeze(0) * Q.unsqueeze(1)).sum(dim=2).div_(cn).neg_().add_(1.0).clamp_(0.0, 2.0)
        else:
            D = (C.unsqueeze(0) - Q.unsqueeze(1)).square_().sum(dim=2).sqrt_()
        ok = keep[s:e].unsqueeze(0).expand(m, -1)
        if exclude_self:
            cols = torch.arange(s, e, device=dev)
            ok = ok & (cols.unsqueeze(0) != queries.unsqueeze(1))
        bad_rows += (~torch.isfinite(D[0]) & ok[0]).sum()
        D = D.masked_fill(~ok, float("inf"))
        # best rows are all below this chunk's, and the chunk's are ascending: a stable sort keeps ties
        # in row order, so the lower row wins a tie
        cat_d = torch.cat([best_d, D], dim=1)
        cat_i = torch.cat([best_i, torch.arange(s, e, device=dev).unsqueeze(0).expand(m, -1)], dim=1)
        sd, pos = torch.sort(cat_d, dim=1, stable=True)
        best_d, best_i = sd[:, :k], torch.gather(cat_i, 1, pos[:, :k])
    flags = torch.stack([bad_query, zero_query, bad_rows])
    return best_d, best_i, flags


def nearest(
    states,
    queries: int | Sequence[int] | np.ndarray,
    k: int = 10,
    *,
    metric: str = "cosine",
    layer: int | None = None,
    eligible=None,
    exclude_self: bool = True,
    chunk_size: int = 4096,
) -> Nearest:
    """The ``k`` rows of ``states`` nearest to each query row, exactly (see the module docstring).

    Parameters
    ----------
    states : (token, d_model) torch tensor (any device) or numpy array, or a store
        :class:`lens.store.views.LayerView` (then ``layer`` names the layer unless the view holds one).
    queries : a row index or a list of them.
    k : neighbours per query.
    metric : ``"cosine"`` (``1 − cos``) or ``"euclidean"``.
    eligible : which rows may be returned: a boolean mask over the rows or row indices (``None``: all);
        e.g. ``store.mask(drop_special=True, min_pos=1)``, the rows the geometry studies analyse.
    exclude_self : leave each query row out of its own list.
    chunk_size : (query, row) pairs compared per step; bounds the extra memory.
    """
    if metric not in METRICS:
        raise LensInputError(f"nearest: metric must be one of {', '.join(METRICS)}; got {metric!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise LensInputError(f"nearest: k must be a positive integer; got {k!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise LensInputError(f"nearest: chunk_size must be a positive integer; got {chunk_size!r}")
    X, rows, n = _layer_of(states, layer)
    q = _index_array(queries, n, "queries")
    keep = _eligible_mask(eligible, n)
    n_candidates = np.full(len(q), int(keep.sum()), dtype=np.int64) - (keep[q] if exclude_self else 0)
    available = int(n_candidates.min())
    if k > available:
        raise LensInputError(
            f"nearest: k={k} neighbours were asked for but only {available} eligible rows are there to choose from")
    dev = X.device
    with _pool_for(dev, len(q) * n * X.shape[1]):
        d, i, flags = _search(X, rows, torch.as_tensor(q, device=dev), torch.as_tensor(keep, device=dev), int(k),
                              metric, exclude_self, int(chunk_size))
    bad_query, zero_query, bad_rows = flags.cpu().tolist()
    if bad_query:
        raise LensInputError(f"nearest: the query rows must hold finite values; {bad_query} of {q.tolist()} hold NaN or inf")
    if zero_query:
        raise LensInputError(f"nearest: cosine distance needs query rows of non-zero norm; {zero_query} of "
                             f"{q.tolist()} are all zeros (use metric='euclidean')")
    if bad_rows:
        raise LensInputError(f"nearest: the states must hold only finite values; {bad_rows} eligible rows hold "
                             "NaN or inf (leave them out with eligible=)")
    return Nearest(queries=q, rows=i.cpu().numpy(), distances=d.to(torch.float64).cpu().numpy(),
                   metric=metric, n_candidates=n_candidates)
