"""Exact k-nearest-neighbour search, certified, at the speed of a bfloat16 matmul; duplicate removal.

Conventions
-----------
- Distances are Euclidean. Neighbours of a point never include the point itself. Returned distances
  are recomputed directly as ``‖x − y‖`` in float64 from the stored values, so they do not depend on
  how the candidates were found (chunk size, precision, device).
- The search holds one ``chunk_size × chunk_size`` tile of distances at a time (plus a centred copy
  of ``X`` and the ``n × (k + extra)`` candidate lists): memory is bounded by the chunk, not ``n²``.
- Distance is symmetric, so only tiles on and above the diagonal are computed; each updates the
  candidate lists of both its row and its column points (half the work). On CPU one compiled pass
  per tile does that (:mod:`geometry._scan`: a vectorised integer pre-compare, then exact inserts of
  the few entries it lets through); elsewhere torch reductions do (``_offdiagonal``).

How it stays exact at low precision
-----------------------------------
Candidates come from the expansion ``‖x‖² + ‖y‖² − 2 x·y`` computed in a fast precision: bfloat16
inputs with float32 accumulation where the hardware multiplies bfloat16 natively (AMX /
AVX512-BF16 CPUs, CUDA), else float32. Rounding moves an approximate squared distance by at most
``e(x, y) = α‖x‖‖y‖ + β(‖x‖² + ‖y‖²) + ρ·|D̃|`` (first-order floating-point bounds for the inputs'
rounding, the dot product's accumulation and the output's rounding, times a safety factor;
``_bounds``). After the float64 re-ranking, a point's k-th exact distance² ``U`` bounds its true
k-th neighbour distance² from above, and every point left out of its list had an approximate value
at least the list's largest, ``T``. Points with ‖y‖ > ‖x‖ + √U are farther than √U anyway, so if
``T(1 − ρ) − α‖x‖N − β(‖x‖² + N²) > U`` with ``N = ‖x‖ + √U``, no left-out point can be a true
neighbour: the list is *certified*. Points whose list is not certified (near-duplicate clusters
whose distances are tiny next to their norms) are searched again against all points in float32,
then, if still not certified, in float64. The answer is therefore exact up to the float64 rounding
of the distances, whatever the precision of the search.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from typing import Any
from contextlib import nullcontext

import numpy as np
import torch
from tqdm.auto import tqdm

from lens.runtime.precision import native_bfloat16

from .arrays import as_matrix, check_finite_rows
from geometry import _scan
from lens.runtime.threads import configure_threads, serial

__all__ = ["knn", "drop_duplicates", "row_hashes", "search_precision", "PRECISIONS", "NeighborGraph",
           "neighbor_graph", "prepare_points"]

log = logging.getLogger(__name__)


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


#: search precisions: "bfloat16x3" splits each value into two bfloat16 parts and multiplies three
#: pairs (hi·hi + hi·lo + lo·hi) in one matmul, close to float32 accuracy at three bfloat16 matmuls'
#: cost; "bfloat16" is one bfloat16 matmul (fast, but its loose error bound leaves many lists
#: uncertified); "float32".
PRECISIONS = ("bfloat16x3", "bfloat16", "float32")
_U16 = 2.0**-8   # unit roundoff of bfloat16 (8 significant bits)
_U32 = 2.0**-24  # of float32


@dataclass(frozen=True)
class _Bound:
    """Error of an approximate squared distance: α‖x‖‖y‖ + β(‖x‖² + ‖y‖²) + ρ|D̃| (see module doc)."""

    alpha: float
    beta: float
    rho: float


def _bounds(precision: str, d: int) -> _Bound:
    g = (d + 4) * _U32 / (1 - (d + 4) * _U32)  # γ of a float32 accumulation of d + 4 products
    rep = 2.0**-22  # the centred float32 copy against the exact points: ≤ 2^-22 (‖x‖ + ‖y‖)²
    if precision == "bfloat16x3":
        # x = hi + lo + r with |r| ≤ u²|x|: the dropped lo·lo' and r terms are ≤ 3.1u²|x||y|
        u, g3 = _U16, (3 * d + 4) * _U32 / (1 - (3 * d + 4) * _U32)
        alpha = 2 * 3.1 * u * u + 2 * g3 * (1 + 3 * u) + 2 * rep
        beta = u * u + g + g3 * (1 + u) + rep
        rho = u / (1 - u)
    elif precision == "bfloat16":
        u = _U16
        alpha = 2 * (2 * u + u * u) + 2 * g * (1 + u) ** 2 + 2 * rep
        beta = u * u + g + 2 * g * (1 + u) ** 2 + rep
        rho = u / (1 - u)  # the tile itself is rounded to bfloat16
    elif precision == "float32":
        alpha = 2 * g + 4 * _U32 + 2 * rep
        beta = g + 2 * _U32 + rep
        rho = 0.0
    else:  # float64 search of a float32 copy: only the copy's rounding counts
        alpha, beta, rho = 2 * rep + 1e-12, rep + 1e-12, 0.0
    s = 1.25  # safety factor over the first-order bounds
    return _Bound(s * alpha, s * beta, s * rho)


def search_precision(device: torch.device | str = "cpu", precision: str = "auto") -> str:
    """The precision the candidate search runs in: ``precision`` itself, or for ``"auto"``
    bfloat16 where matmuls take it natively (CUDA; CPUs with AMX or AVX512-BF16), else float32."""
    if precision not in ("auto",) + PRECISIONS:
        raise ValueError(f"precision must be 'auto' or one of {PRECISIONS}; got {precision!r}")
    if precision != "auto":
        return precision
    return "bfloat16x3" if native_bfloat16(device) else "float32"


def _fp32_matmul_is_exact_fp32(device: torch.device) -> bool:
    """False when torch may run float32 matmuls in TF32 / bfloat16 (then the float32 bound is wrong)."""
    if torch.get_float32_matmul_precision() != "highest":
        return False
    if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return False
    return True


def _lut() -> np.ndarray:
    """float32 value of every bfloat16 bit pattern (256 KiB): the CPU scan reads a bfloat16 tile
    through it instead of converting the tile in an extra pass."""
    global _LUT
    if _LUT is None:
        bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
        _LUT = bits.view(torch.bfloat16).to(torch.float32).numpy().copy()
    return _LUT


_LUT: np.ndarray | None = None


def _bf16_tile(A: torch.Tensor, B: torch.Tensor):
    """The tile function of bfloat16 operands (``tile.rows(rows, s1, e1)``: arbitrary rows)."""

    def tile(s0, e0, s1, e1):
        return A[s0:e0] @ B[s1:e1].T

    tile.rows = lambda rows, s1, e1: A[rows] @ B[s1:e1].T
    return tile


def _centre_compiled(X: torch.Tensor, mean: torch.Tensor, precision: str):
    """CPU, bfloat16 kinds: ``(Xs, sq, norms, tile)`` from one compiled pass over ``X``
    (:func:`geometry._scan.centre_and_operands`; the operands are bit for bit :func:`_operands`')."""
    n, d = X.shape
    width = 3 * d + 4 if precision == "bfloat16x3" else d + 4
    Xs = torch.empty((n, d), dtype=torch.float32)
    sq = torch.empty(n, dtype=torch.float32)
    norms = torch.empty(n, dtype=torch.float64)
    A = torch.empty((n, width), dtype=torch.int16)
    B = torch.empty((n, width), dtype=torch.int16)
    _scan.centre_and_operands(X.numpy(), mean.reshape(-1).numpy(), X.dtype == torch.float32,
                              precision == "bfloat16x3", Xs.numpy(), sq.numpy(), norms.numpy(),
                              A.numpy().view(np.uint16), B.numpy().view(np.uint16))
    return Xs, sq, norms, _bf16_tile(A.view(torch.bfloat16), B.view(torch.bfloat16))


def _operands(Xs: torch.Tensor, sq: torch.Tensor, precision: str):
    """A function ``tile(s0, e0, s1, e1)`` giving approximate squared distances of rows s0:e0 to
    rows s1:e1 of ``Xs``. In bfloat16 the norms ride along as extra columns (split into two
    bfloat16 parts each, so their rounding is second order), so one matmul yields the distances."""
    if precision == "bfloat16x3":
        hi = sq.to(torch.bfloat16).to(torch.float32)
        lo = (sq - hi).unsqueeze(1)
        hi, one = hi.unsqueeze(1), torch.ones_like(hi).unsqueeze(1)
        xh = Xs.to(torch.bfloat16)
        xl = (Xs - xh.to(torch.float32)).to(torch.bfloat16)
        A = torch.cat([xh, xh, xl, hi.to(torch.bfloat16), lo.to(torch.bfloat16), one.to(torch.bfloat16),
                       one.to(torch.bfloat16)], dim=1)
        B = torch.cat([xh * -2.0, xl * -2.0, xh * -2.0, one.to(torch.bfloat16), one.to(torch.bfloat16),
                       hi.to(torch.bfloat16), lo.to(torch.bfloat16)], dim=1)
        del xh, xl
        return _bf16_tile(A, B)
    if precision == "bfloat16":
        hi = sq.to(torch.bfloat16).to(torch.float32)
        lo = (sq - hi).unsqueeze(1)
        hi, one = hi.unsqueeze(1), torch.ones_like(hi).unsqueeze(1)
        A = torch.cat([Xs, hi, lo, one, one], dim=1).to(torch.bfloat16)
        B = torch.cat([Xs * -2.0, one, one, hi, lo], dim=1).to(torch.bfloat16)
        return _bf16_tile(A, B)

    def tile(s0, e0, s1, e1):
        D = torch.addmm(sq[s1:e1].unsqueeze(0), Xs[s0:e0], Xs[s1:e1].T, alpha=-2.0)
        return D.add_(sq[s0:e0].unsqueeze(1))

    return tile


def _scan_torch(D: torch.Tensor, s0: int, s1: int, diag: bool, best_d, best_i) -> None:
    """Torch version of the tile scan (any device)."""
    D = D.to(best_d.dtype)
    if diag:
        e0 = s0 + D.shape[0]
        D.fill_diagonal_(float("inf"))
        kr = min(best_d.shape[1], D.shape[1])
        d_r, i_r = torch.topk(D, kr, dim=1, largest=False)
        best_d[s0:e0], best_i[s0:e0] = _merge(best_d[s0:e0], best_i[s0:e0], d_r, i_r + s0, best_d.shape[1])
    else:
        _offdiagonal(D, best_d, best_i, s0, s1)


_USE_COMPILED = True  # tests turn it off to run the torch path (the one CUDA takes) on CPU


def _compiled(device: torch.device) -> bool:
    return device.type == "cpu" and _USE_COMPILED


def _symmetric_search(Xs, sq, kc, precision, chunk_size, progress, tile=None):
    """Candidate lists (approximate squared distances, ascending; indices) of every point.
    ``tile``: the operands of ``precision`` when already built (:func:`_operands`)."""
    n, dev = Xs.shape[0], Xs.device
    best_d = torch.full((n, kc), float("inf"), dtype=torch.float32, device=dev)
    best_i = torch.full((n, kc), -1, dtype=torch.long, device=dev)
    tile = _operands(Xs, sq, precision) if tile is None else tile
    starts = list(range(0, n, chunk_size))
    bar = tqdm(total=len(starts) * (len(starts) + 1) // 2, desc="knn tiles", disable=not progress, leave=False)
    compiled = _compiled(dev)
    if compiled:
        scan = _CompiledScan(best_d.numpy(), best_i.numpy(), precision.startswith("bfloat16"),
                             _scan_threads())
    try:
        for a, s0 in enumerate(starts):
            e0 = min(s0 + chunk_size, n)
            for s1 in starts[a:]:
                D = tile(s0, e0, s1, min(s1 + chunk_size, n))
                if compiled:
                    scan(D, s0, s1)
                else:
                    _scan_torch(D, s0, s1, s1 == s0, best_d, best_i)
                bar.update(1)
    finally:
        if compiled:
            scan.close()
    bar.close()
    return best_d, best_i


def _scan_threads() -> int:
    """Threads for the compiled tile scan: ``_SCAN_THREADS``, or with None torch's intra-op count
    (which :mod:`lens.runtime.threads` sized from the cores really available; 1 inside ``serial()``). The
    scan runs between two tile matmuls, never at the same time as torch's pool."""
    return max(1, torch.get_num_threads()) if _SCAN_THREADS is None else _SCAN_THREADS


# One thread by default. Measured side by side (20k x 576, k = 2, load average 6): 3.8-4.2 s with the
# scan on one thread against 4.5-4.8 s on two. The masked scan takes about 2 ms per 2048² tile against
# 13+ ms for its matmul, so a second thread can save little, and handing each tile to a pool thread
# costs a scheduler wake-up on a busy machine. None: torch's thread count (tests pin other counts).
_SCAN_THREADS: int | None = 1


class _CompiledScan:
    """Scans tiles into the candidate lists ``bd``/``bi`` (numpy views) with the compiled passes.

    Every tile goes through the masked scan (:mod:`geometry._scan`). An off-diagonal tile is one
    pass on one thread,
    on ``threads`` > 1 split into row bands and column bands (their lists are disjoint), run by a
    thread pool that executes only compiled, GIL-free code. Every way gives the one-pass result bit
    for bit (see :mod:`geometry._scan`)."""

    def __init__(self, bd: np.ndarray, bi: np.ndarray, bf16: bool, threads: int):
        self.bd, self.bi, self.bf16, self.threads = bd, bi, bf16, threads
        self.pool = None
        if threads > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="knn-scan")
        if bf16:
            self.diag = lambda D, s0: _scan.scan_diag_bf16(D, s0, bd, bi)
            self.off = lambda D, s0, s1, a0, a1, b0, b1, rows, cols: _scan.scan_offdiag_bf16(
                D, s0, s1, a0, a1, b0, b1, rows, cols, bd, bi)
        else:
            self.diag = lambda D, s0: _scan.scan_diag_f32(D, s0, bd, bi)
            self.off = lambda D, s0, s1, a0, a1, b0, b1, rows, cols: _scan.scan_offdiag_f32(
                D, s0, s1, a0, a1, b0, b1, rows, cols, bd, bi)

    def __call__(self, D: torch.Tensor, s0: int, s1: int) -> None:
        D = D.view(torch.int16).numpy().view(np.uint16) if self.bf16 else D.numpy()
        m, p = D.shape
        if s0 == s1:
            self.diag(D, s0)
            return
        if self.pool is None:
            self.off(D, s0, s1, 0, m, 0, p, True, True)
            return
        nr, nc = (self.threads + 1) // 2, self.threads // 2
        tasks = [(m * t // nr, m * (t + 1) // nr, 0, p, True, False) for t in range(nr)]
        tasks += [(0, m, p * t // nc, p * (t + 1) // nc, False, True) for t in range(nc)]
        futures = [self.pool.submit(self.off, D, s0, s1, *t) for t in tasks[1:]]
        self.off(D, s0, s1, *tasks[0])
        for fut in futures:
            fut.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _rows_search(Xs, sq, rows, kc, dtype, chunk_size):
    """Candidate lists of the points ``rows`` against all points, with matmuls in ``dtype``."""
    n, dev = Xs.shape[0], Xs.device
    m = rows.numel()
    best_d = torch.full((m, kc), float("inf"), dtype=dtype, device=dev)
    best_i = torch.full((m, kc), -1, dtype=torch.long, device=dev)
    Xd, sqd = (Xs, sq) if dtype == Xs.dtype else (Xs.to(dtype), torch.linalg.vector_norm(Xs.to(dtype), dim=1) ** 2)
    compiled = _compiled(dev)
    if compiled:
        from . import _scan
    for r in range(0, m, chunk_size):
        rr = rows[r : r + chunk_size]
        Xr, sqr = Xd[rr], sqd[rr]
        for s1 in range(0, n, chunk_size):
            e1 = min(s1 + chunk_size, n)
            D = torch.addmm(sqd[s1:e1].unsqueeze(0), Xr, Xd[s1:e1].T, alpha=-2.0).add_(sqr.unsqueeze(1))
            if compiled:
                _scan.scan_rows(D.numpy(), rr.numpy(), s1, best_d[r : r + chunk_size].numpy(),
                                best_i[r : r + chunk_size].numpy())
            else:
                self_col = (rr >= s1) & (rr < e1)
                D[torch.nonzero(self_col).flatten(), (rr[self_col] - s1)] = float("inf")
                kr = min(kc, e1 - s1)
                d_r, i_r = torch.topk(D, kr, dim=1, largest=False)
                best_d[r : r + chunk_size], best_i[r : r + chunk_size] = _merge(
                    best_d[r : r + chunk_size], best_i[r : r + chunk_size], d_r, i_r + s1, kc)
    return best_d.to(torch.float32) if dtype != torch.float64 else best_d, best_i


def _exact(Xe: torch.Tensor, rows: torch.Tensor, cand: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Exact squared distances (float64) from each point of ``rows`` to its candidates ``cand``."""
    m, kc = cand.shape
    out = torch.empty((m, kc), dtype=torch.float64, device=Xe.device)
    if _compiled(Xe.device):
        from . import _scan

        _scan.exact_sq_distances(Xe.numpy(), rows.numpy(), cand.numpy(), out.numpy())
        return out
    step = max(1, (chunk_size * chunk_size) // max(1, 2 * kc * Xe.shape[1]))
    for s in range(0, m, step):
        diff = Xe[cand[s : s + step]].to(torch.float64) - Xe[rows[s : s + step]].to(torch.float64).unsqueeze(1)
        out[s : s + step] = diff.square_().sum(dim=2)
    return out


def _certified(approx_last, exact_sorted, k, norms, bound: _Bound, complete: bool) -> torch.Tensor:
    """Which candidate lists provably hold the k true nearest neighbours (see the module docstring)."""
    if complete:
        return torch.ones(approx_last.shape[0], dtype=torch.bool, device=approx_last.device)
    U = exact_sorted[:, k - 1]
    T = approx_last.to(torch.float64)
    nx = norms * (1 + 2.0**-20)
    N = nx + U.sqrt()
    lower = T * (1 - bound.rho) - bound.alpha * nx * N - bound.beta * (nx * nx + N * N)
    return torch.isinf(T) | (lower > U)


@torch.no_grad()
def knn(
    X: torch.Tensor,
    k: int,
    *,
    chunk_size: int = 2048,
    extra: int | None = None,
    precision: str = "auto",
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest neighbours of every row of ``X`` among the other rows.

    Parameters
    ----------
    X : (n_samples, n_features) tensor, on the device to compute on.
    k : number of neighbours (excluding the point itself); needs ``n_samples > k``.
    chunk_size : rows per tile; peak extra memory is about ``chunk_size² × 4`` bytes per tile.
    extra : additional candidates kept per point before the exact re-ranking (default
        ``max(4, k // 4)`` in bfloat16x3, ``max(8, k)`` in bfloat16, ``max(2, k // 4)`` in float32);
        more makes certification (module docstring) succeed more often, at a small cost.
    precision : ``"auto"`` or one of :data:`PRECISIONS`: the precision of the candidate search
        (:func:`search_precision`). On a CPU where that is bfloat16x3, ``"auto"`` with k ≤ 8 on
        4+ chunks first certifies a pilot sample in single bfloat16 and searches in bfloat16 when
        it certifies (:func:`_pilot`). The result is the same in every precision.
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
    with _pool_for(X):
        return _knn(X, k, chunk_size, extra, precision, progress)


def _pool_for(X: torch.Tensor):
    """One thread for a small CPU search, the configured pool for a large one.

    On a busy machine every parallel torch op waits at its barrier for a descheduled worker, about
    a scheduler time slice: a search of a few thousand points is dozens of small ops, which then
    cost far more on two threads than on one (measured under load: an ``isfinite`` of 6000 × 64
    took 47 ms). Only the tile matmuls of a large search are worth the pool."""
    if X.device.type != "cpu":
        return nullcontext()
    configure_threads()
    n, d = X.shape
    return serial() if n * n * d <= _SERIAL_WORK else nullcontext()


_SERIAL_WORK = 8192 * 8192 * 576  # n²·d below which a CPU search runs on one thread


def _extra(prec: str, k: int) -> int:
    """Default extra candidates per point (see :func:`knn`)."""
    return {"bfloat16": max(8, k), "bfloat16x3": max(4, k // 4)}.get(prec, max(2, k // 4))


# "auto" on a CPU with native bfloat16 and a small k: a single-bfloat16 search costs a third of the
# bfloat16x3 matmul work (measured: a 2048² tile 12.8 ms against 21 ms quiet, 30 against 87 ms under
# load), but its looser error bound leaves more lists uncertified, and each uncertified point is
# searched again against all n points in float32 (37 ms per 2048² pairs). Per n²/2 pairs that is
# worth it while the uncertified fraction f stays below (c3 − c16) / (2·c32) ≈ 0.11; which side a
# point set falls on depends on the data (real residual streams with massive-activation dimensions
# certify poorly even in bfloat16x3), so a pilot decides: _PILOT_ROWS evenly spaced points are
# searched against all points in bfloat16 and certified, and bfloat16 is taken only when at most
# _PILOT_MAX_UNCERTIFIED of them fail (well inside the break-even, since the pilot is a sample).
# Either way the result is exact: the precision changes only the speed.
_PILOT_ROWS = 512
_PILOT_MAX_UNCERTIFIED = 0.03
_PILOT_MAX_K = 8          # larger k: longer lists make the bfloat16 scan dearer; not measured
_PILOT_MIN_CHUNKS = 4     # smaller sets: the pilot's cost is not worth it


def _pilot(Xs, Xe, norms, k, kc, tile, bound, chunk_size):
    """(uncertified, sampled): certify the lists of evenly spaced points searched against all
    points with the operands ``tile`` (a bfloat16 kind) and its ``bound``."""
    n = Xs.shape[0]
    m = min(_PILOT_ROWS, n)
    rows = torch.arange(m, dtype=torch.long) * n // m
    bd = np.full((m, kc), np.inf, dtype=np.float32)
    bi = np.full((m, kc), -1, dtype=np.int64)
    for s1 in range(0, n, chunk_size):
        D = tile.rows(rows, s1, min(s1 + chunk_size, n)).to(torch.float32)
        _scan.scan_rows(D.numpy(), rows.numpy(), s1, bd, bi)
    bi_t = torch.from_numpy(bi)
    ex, _ = torch.sort(_exact(Xe, rows, bi_t, chunk_size), dim=1)
    ok = _certified(torch.from_numpy(bd[:, -1]), ex, k, norms[rows], bound, complete=False)
    return int((~ok).sum()), m


def _knn(X, k, chunk_size, extra, precision, progress):
    n, dev = X.shape[0], X.device
    prec = search_precision(dev, precision)
    if prec == "float32" and not _fp32_matmul_is_exact_fp32(dev):
        bound = _bounds("bfloat16", X.shape[1])  # TF32 / bf16 "float32" matmuls: bf16 bound is safe
    else:
        bound = _bounds(prec, X.shape[1])
    with _serial_on(dev):  # O(n·d) preparation and the pilot: one thread (see _serial_on)
        tile, prec, bound, Xs, sq, norms, Xe = _prepare(X, k, chunk_size, extra, precision, prec, bound)
    kc = min(k + (_extra(prec, k) if extra is None else extra), n - 1)
    best_d, best_i = _symmetric_search(Xs, sq, kc, prec, chunk_size, progress, tile)
    return _finish(X, Xs, sq, Xe, norms, best_d, best_i, k, kc, prec, bound, chunk_size)


def _serial_on(dev: torch.device, work: int = 0):
    """``lens.runtime.threads.serial()`` on CPU for work below the pool's break-even, else nothing.

    Everything but the tile matmuls is O(n·d) elementwise work, small matmuls (the pilot, the
    re-search of a few points) or compiled single-thread loops: on a busy machine each parallel
    torch op there waits about a scheduler time slice at its barrier (the 20k-point profile under
    load: a 37-row float32 re-search took 31 ms per 2048-column matmul, a 4096-row ``isfinite``
    63 ms), so they run on one thread. ``work``: n·m·d of a re-search, pooled above ``_SERIAL_WORK``."""
    return serial() if dev.type == "cpu" and work <= _SERIAL_WORK else nullcontext()


def _prepare(X, k, chunk_size, extra, precision, prec, bound):
    n, dev = X.shape[0], X.device
    # Centring does not change distances but shrinks the norms, which shrinks every rounding error
    # (they scale with ‖x‖‖y‖). Subtract in the input's precision, then round once.
    mean = X.mean(dim=0, keepdim=True, dtype=torch.float64)
    Xe = X if X.dtype in (torch.float32, torch.float64) else X.to(torch.float32)
    Xe = Xe.contiguous()
    fused = _compiled(dev) and prec.startswith("bfloat16")
    pilot = precision == "auto" and prec == "bfloat16x3" and _compiled(dev) and k <= _PILOT_MAX_K \
        and n >= _PILOT_MIN_CHUNKS * chunk_size
    if fused:  # one compiled pass: centring, norms and the operands (of the pilot's precision first)
        Xs, sq, norms, built = _centre_compiled(Xe, mean, "bfloat16" if pilot else prec)
    else:
        Xs = (X.to(torch.float64) - mean).to(torch.float32) if X.dtype == torch.float64 else \
            (X.to(torch.float32) - mean.to(torch.float32))
        sq = torch.linalg.vector_norm(Xs, dim=1).square_()
        norms = torch.linalg.vector_norm(Xs.to(torch.float64), dim=1)
        built = None

    tile = built
    if pilot:
        kc16 = min(k + (_extra("bfloat16", k) if extra is None else extra), n - 1)
        b16 = _bounds("bfloat16", X.shape[1])
        bad, m = _pilot(Xs, Xe, norms, k, kc16, built, b16, chunk_size)
        if bad <= _PILOT_MAX_UNCERTIFIED * m:
            prec, bound = "bfloat16", b16
        else:
            tile = built = None
            Xs, sq, norms, tile = _centre_compiled(Xe, mean, prec)
        log.info("knn: pilot of %d evenly spaced points: %d not certified in bfloat16; searching in %s",
                 m, bad, prec)
    return tile, prec, bound, Xs, sq, norms, Xe


def _finish(X, Xs, sq, Xe, norms, best_d, best_i, k, kc, prec, bound, chunk_size):
    """Exact re-ranking, certification and the re-search of uncertified points."""
    n, dev = X.shape[0], X.device
    with _serial_on(dev):
        rows = torch.arange(n, device=dev)
        exact = _exact(Xe, rows, best_i, chunk_size)
        exact, pos = torch.sort(exact, dim=1)
        cand = torch.gather(best_i, 1, pos)
        ok = _certified(best_d[:, -1], exact, k, norms, bound, complete=kc >= n - 1)
    for dtype in (torch.float32, torch.float64):  # search the uncertified points again, more precisely
        bad = torch.nonzero(~ok).flatten()
        if bad.numel() == 0:
            break
        if dtype == torch.float32 and prec == "float32":
            continue  # already searched in float32
        log.info("knn: %d of %d candidate lists not certified; searching them in %s", bad.numel(), n, dtype)
        with _serial_on(dev, bad.numel() * n * X.shape[1]):
            bd, bi = _rows_search(Xs, sq, bad, kc, dtype, chunk_size)
        with _serial_on(dev):
            ex = _exact(Xe, bad, bi, chunk_size)
            ex, p = torch.sort(ex, dim=1)
            exact[bad], cand[bad] = ex, torch.gather(bi, 1, p)
            if dtype == torch.float32:
                b32 = _bounds("float32", X.shape[1]) if _fp32_matmul_is_exact_fp32(dev) else bound
                ok[bad] = _certified(bd[:, -1], ex, k, norms[bad], b32, complete=False)
    return exact[:, :k].sqrt_(), cand[:, :k].contiguous()


@dataclass(frozen=True)
class NeighborGraph:
    """The k nearest neighbours of every distinct point of one point cloud: computed once, read by
    every kNN consumer (TwoNN reads the first two columns, MLE the first ``n_neighbors``).

    distances : (point, k) float64, ascending. indices : (point, k) int64 into the distinct points.
    sample_index : (point,) int64, the rows of the original ``X`` that were kept (duplicates dropped).
    n_duplicates : exact duplicate rows dropped. n_features : columns of ``X``.
    """

    distances: torch.Tensor
    indices: torch.Tensor
    sample_index: torch.Tensor
    n_duplicates: int
    n_features: int

    @property
    def k(self) -> int:
        return int(self.distances.shape[1])

    @property
    def n_points(self) -> int:
        return int(self.distances.shape[0])

    def first(self, k: int) -> "NeighborGraph":
        """The same graph cut to its first ``k`` neighbours (exactly what a k-search would give)."""
        if not 1 <= k <= self.k:
            raise ValueError(f"this neighbour graph holds {self.k} neighbours per point; {k} were asked for")
        return NeighborGraph(self.distances[:, :k], self.indices[:, :k], self.sample_index,
                             self.n_duplicates, self.n_features)


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


def neighbor_graph(
    X: Any,
    k: int,
    *,
    min_points: int | None = None,
    what: str = "kNN",
    device: str | torch.device | None = None,
    chunk_size: int = 2048,
    precision: str = "auto",
    progress: bool = False,
) -> NeighborGraph:
    """Validate ``X``, drop duplicate rows and find every distinct point's ``k`` nearest neighbours.

    ``min_points`` (default ``k + 1``) and ``what`` shape the error for too few distinct points.
    """
    T = as_matrix(X, "X", device=device)
    with _pool_for(T):
        with _serial_on(T.device):  # O(n·d) elementwise checks: one thread (see _serial_on)
            U, kept, n_dup = prepare_points(T, min_points=k + 1 if min_points is None else min_points,
                                            what=what)
        dist, idx = knn(U, k, chunk_size=chunk_size, precision=precision, progress=progress)
    return NeighborGraph(dist, idx, kept, n_dup, int(U.shape[1]))
