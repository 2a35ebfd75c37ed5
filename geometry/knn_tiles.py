"""The distance tiles of the exact kNN search (:mod:`geometry.neighbors`): squared distances in a fast
precision (bfloat16, bfloat16x3, float32), the rounding bound of each precision, the merges of a tile into
the running candidate lists (torch; the CPU's compiled scan is :mod:`geometry._scan`), and the certificate
that a re-ranked list holds the true k nearest neighbours (see :mod:`geometry.neighbors`' docstring)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from geometry import _scan
from lens.runtime.precision import native_bfloat16


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
