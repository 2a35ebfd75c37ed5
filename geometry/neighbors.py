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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from typing import Any
from contextlib import nullcontext

import numpy as np
import torch
from tqdm.auto import tqdm

from .arrays import as_matrix
from geometry import _scan
# the tiles and the duplicate removal live in their own modules; their names stay importable from here
from .duplicates import _hashes_and_finite, drop_duplicates, prepare_points, row_hashes  # noqa: F401
from .knn_tiles import (  # noqa: F401
    PRECISIONS, _Bound, _bf16_tile, _bounds, _centre_compiled, _certified, _compiled, _fp32_matmul_is_exact_fp32,
    _lut, _merge, _merge_sparse, _offdiagonal, _operands, _scan_torch, search_precision,
)
from lens.runtime.threads import configure_threads, serial

__all__ = ["knn", "drop_duplicates", "row_hashes", "search_precision", "PRECISIONS", "NeighborGraph",
           "neighbor_graph", "prepare_points"]

log = logging.getLogger(__name__)


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
        _scan.exact_sq_distances(Xe.numpy(), rows.numpy(), cand.numpy(), out.numpy())
        return out
    step = max(1, (chunk_size * chunk_size) // max(1, 2 * kc * Xe.shape[1]))
    for s in range(0, m, step):
        diff = Xe[cand[s : s + step]].to(torch.float64) - Xe[rows[s : s + step]].to(torch.float64).unsqueeze(1)
        out[s : s + step] = diff.square_().sum(dim=2)
    return out


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
    mean = _column_mean(X)
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


def _column_mean(X: torch.Tensor) -> torch.Tensor:
    """(1, d) float64 column means of ``X``. On the CPU through numpy: torch's float64-accumulated mean of a
    float32 matrix measured 9x numpy's (10000 x 576 on one thread: 75 ms against 8 ms), and it ran on every
    point set of an ID profile. The centre only conditions the candidate search (the certificate holds for
    any centre; distances are recomputed from the stored values), so the answer does not depend on it."""
    if X.device.type == "cpu" and X.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(X.detach().numpy().mean(axis=0, dtype=np.float64, keepdims=True))
    return X.mean(dim=0, keepdim=True, dtype=torch.float64)


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
