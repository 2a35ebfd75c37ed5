"""Chunked exact k-nearest-neighbour search on torch, and duplicate removal.

Conventions
-----------
- Distances are Euclidean. Neighbours of a point never include the point itself.
- The search never holds more than one ``chunk_size × chunk_size`` block of distances (plus a
  centred float32 copy of ``X`` and the running ``n × k`` best lists), so the extra memory is
  bounded by the chunk size, not by ``n²``.
- Candidates are found with the fast expansion ``‖x‖² + ‖y‖² − 2 x·y`` in float32 (whatever the
  input dtype: float32 matmuls are about twice as fast as float64), which loses precision when neighbour distances are much smaller than the norms; the
  final distances of the ``k + extra`` best candidates are therefore recomputed directly as
  ``‖x − y‖`` in float64 and re-sorted. This is what makes the estimates agree with scikit-learn's.
- Because distance is symmetric, only the tiles on and above the diagonal are computed; each tile
  updates the neighbour lists of both its row and column points (halving the work). Off-diagonal
  tiles pass on only the entries below a point's current k-th best distance, found for the few
  points whose minimum in the tile beats it (see ``_offdiagonal``).
"""

from __future__ import annotations

import logging

import torch
from tqdm.auto import tqdm

__all__ = ["knn", "drop_duplicates", "row_hashes"]

log = logging.getLogger(__name__)


_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


def row_hashes(X: torch.Tensor, chunk_size: int = 4096) -> torch.Tensor:
    """A 64-bit hash of each row's exact bit pattern (``-0.0`` counted as ``0.0``), computed chunk
    by chunk so no full-size temporary is made. Integer arithmetic wraps, so it is exact and
    independent of summation order: identical rows always get identical hashes."""
    n, d = X.shape
    gen = torch.Generator().manual_seed(0x5EED)
    w = torch.randint(-(2**62), 2**62, (d,), generator=gen, dtype=torch.int64).to(X.device) | 1
    out = torch.empty(n, dtype=torch.int64, device=X.device)
    for s in range(0, n, chunk_size):
        bits = (X[s : s + chunk_size] + 0.0).contiguous().view(_INT_VIEW[X.dtype]).to(torch.int64)
        out[s : s + chunk_size] = (bits * w).sum(dim=1)
    return out


def drop_duplicates(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop exact duplicate rows, keeping the first copy and the original order.

    Returns ``(X_unique, kept_index)`` where ``kept_index`` indexes the rows of ``X`` that were kept.
    Duplicate points have zero distance to a neighbour, which makes TwoNN's ratio r2/r1 infinite and
    MLE's log(r_k/r_j) infinite; they carry no information about the manifold's dimension.
    Rows are grouped by :func:`row_hashes` (O(n) memory, unlike sorting whole rows) and a row is a
    duplicate only if it equals its group's first row exactly.
    """
    n = X.shape[0]
    dev = X.device
    h = row_hashes(X)
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


def _merge(best_d: torch.Tensor, best_i: torch.Tensor, d: torch.Tensor, i: torch.Tensor, k: int):
    """Merge dense candidate lists into the running best lists (smallest k, ascending)."""
    cat_d = torch.cat([best_d, d], dim=1)
    cat_i = torch.cat([best_i, i], dim=1)
    top_d, pos = torch.topk(cat_d, k, dim=1, largest=False)
    return top_d, torch.gather(cat_i, 1, pos)


def _merge_sparse(best_d: torch.Tensor, best_i: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                  d: torch.Tensor) -> None:
    """Merge candidate triples (point p, neighbour q, distance d) into the best lists, in place."""
    kc = best_d.shape[1]
    P, inv = torch.unique(p, return_inverse=True)
    m = P.numel()
    local = torch.arange(m, device=p.device).repeat_interleave(kc)
    all_p = torch.cat([local, inv])
    all_d = torch.cat([best_d[P].flatten(), d])
    all_q = torch.cat([best_i[P].flatten(), q])
    order = torch.argsort(all_d, stable=True)
    order = order[torch.argsort(all_p[order], stable=True)]  # grouped by point, ascending distance
    grouped = all_p[order]
    counts = torch.bincount(grouped, minlength=m)
    rank = torch.arange(grouped.numel(), device=p.device) - (torch.cumsum(counts, 0) - counts)[grouped]
    keep = order[rank < kc]  # every group holds >= kc entries (its old list), so exactly kc survive
    best_d[P] = all_d[keep].view(m, kc)
    best_i[P] = all_q[keep].view(m, kc)


def _offdiagonal(D: torch.Tensor, best_d: torch.Tensor, best_i: torch.Tensor, s0: int, s1: int) -> None:
    """Update the lists of tile ``D``'s row points (from offset ``s0``) and column points (``s1``).

    Only entries below a point's current k-th best can enter its list. A min-reduction per side
    finds the points with any such entry ("active"); for those alone, the entries below the
    threshold are extracted and merged. After a point has seen j chunks, it is active with
    probability about kc / j, so late tiles cost little more than the two reductions — far less
    than a top-k per row and a strided top-k per column.
    """
    tau_r, tau_c = best_d[s0 : s0 + D.shape[0], -1], best_d[s1 : s1 + D.shape[1], -1]
    ps, qs, ds = [], [], []
    act = torch.nonzero(D.amin(dim=1) < tau_r).flatten()
    if act.numel():
        sub = D if act.numel() == D.shape[0] else D[act]
        r, c = torch.nonzero(sub < tau_r[act].unsqueeze(1), as_tuple=True)
        ps.append(act[r] + s0), qs.append(c + s1), ds.append(sub[r, c])
    act = torch.nonzero(D.amin(dim=0) < tau_c).flatten()
    if act.numel():
        sub = D if act.numel() == D.shape[1] else D.index_select(1, act)
        r, c = torch.nonzero(sub < tau_c[act].unsqueeze(0), as_tuple=True)
        ps.append(act[c] + s1), qs.append(r + s0), ds.append(sub[r, c])
    if ps:
        _merge_sparse(best_d, best_i, torch.cat(ps), torch.cat(qs), torch.cat(ds))


@torch.no_grad()
def knn(
    X: torch.Tensor,
    k: int,
    *,
    chunk_size: int = 2048,
    extra: int | None = None,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest neighbours of every row of ``X`` among the other rows.

    Parameters
    ----------
    X : (n_samples, n_features) tensor, on the device to compute on.
    k : number of neighbours (excluding the point itself); needs ``n_samples > k``.
    chunk_size : rows per tile; peak extra memory is about ``chunk_size² × 4`` bytes per tile.
    extra : additional candidates kept before the float64 refinement (default ``max(2, k // 4)``).
    progress : show a tqdm bar over tiles.

    Returns
    -------
    distances : (n_samples, k) float64, ascending along axis 1.
    indices : (n_samples, k) int64, row indices into ``X``.
    """
    n = X.shape[0]
    if k < 1:
        raise ValueError(f"k must be a positive integer; got {k}")
    if n <= k:
        raise ValueError(f"k-nearest-neighbour search with k={k} needs more than {k} points; got {n}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer; got {chunk_size}")
    extra = max(2, k // 4) if extra is None else extra
    kc = min(k + extra, n - 1)
    dev = X.device
    search_dtype = torch.float32
    # Centring does not change distances but shrinks the norms, which reduces cancellation error
    # in the ‖x‖² + ‖y‖² − 2x·y expansion.
    Xs = X.to(search_dtype, copy=True).sub_(X.mean(dim=0, keepdim=True).to(search_dtype))
    sq = torch.linalg.vector_norm(Xs, dim=1).square_()  # no n × d temporary

    best_d = torch.full((n, kc), float("inf"), dtype=search_dtype, device=dev)
    best_i = torch.full((n, kc), -1, dtype=torch.long, device=dev)
    starts = list(range(0, n, chunk_size))
    n_tiles = len(starts) * (len(starts) + 1) // 2
    bar = tqdm(total=n_tiles, desc="knn tiles", disable=not progress, leave=False)

    def tile(s0: int, e0: int, s1: int, e1: int) -> torch.Tensor:
        # D[i, j] = ‖x_i − x_j‖² for rows s0:e0 and columns s1:e1
        D = torch.addmm(sq[s1:e1].unsqueeze(0), Xs[s0:e0], Xs[s1:e1].T, alpha=-2.0)
        return D.add_(sq[s0:e0].unsqueeze(1))

    # 1. Diagonal tiles: every point gets a first (finite) best list from its own chunk.
    for s0 in starts:
        e0 = min(s0 + chunk_size, n)
        D = tile(s0, e0, s0, e0).fill_diagonal_(float("inf"))
        kr = min(kc, e0 - s0)
        d_r, i_r = torch.topk(D, kr, dim=1, largest=False)
        best_d[s0:e0], best_i[s0:e0] = _merge(best_d[s0:e0], best_i[s0:e0], d_r, i_r + s0, kc)
        bar.update(1)
    # 2. Off-diagonal tiles, each used for its rows and its columns (see _offdiagonal).
    for a, s0 in enumerate(starts):
        e0 = min(s0 + chunk_size, n)
        for s1 in starts[a + 1:]:
            _offdiagonal(tile(s0, e0, s1, min(s1 + chunk_size, n)), best_d, best_i, s0, s1)
            bar.update(1)
    bar.close()

    # Exact float64 distances for the candidates, re-sorted; chunked so the gather stays small.
    out_d = torch.empty((n, k), dtype=torch.float64, device=dev)
    out_i = torch.empty((n, k), dtype=torch.long, device=dev)
    # rows per step so the float64 gather (rows × kc × d × 8 bytes) stays about one float32 tile
    step = max(1, (chunk_size * chunk_size) // max(1, 2 * kc * X.shape[1]))
    for s in range(0, n, step):
        e = min(s + step, n)
        diff = X[best_i[s:e]].to(torch.float64) - X[s:e].to(torch.float64).unsqueeze(1)
        d = torch.linalg.vector_norm(diff, dim=2)
        d, pos = torch.sort(d, dim=1)
        out_d[s:e] = d[:, :k]
        out_i[s:e] = torch.gather(best_i[s:e], 1, pos[:, :k])
    return out_d, out_i
