"""Tensor identities the derivation checks on the probe's tensors: equal up to rounding, non-zero, a sum
of states, a multiple of a state."""

from __future__ import annotations

import torch


def _tol(x: torch.Tensor) -> float:
    return 1e-4 if x.dtype == torch.float32 or x.dtype == torch.float64 else 2e-2


def close(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """``a`` equals ``b`` up to the rounding of a different summation order. Non-finite entries (a
    model with an overflowing or NaN layer) must sit at the same places in both; the rest is compared."""
    if a is None or b is None or a.shape != b.shape or not a.is_floating_point():
        return False
    tol = max(_tol(a), _tol(b))  # the inputs' dtype decides (a bfloat16 model's sums round at 2^-8), not float32's
    a, b = a.float(), b.float()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not (fa.all() and fb.all()):
        if not torch.equal(fa, fb) or not fa.any():
            return False
        a, b = a[fa], b[fb]
    scale = float(b.abs().max()) + float(a.abs().max())
    return float((a - b).abs().max()) <= tol * (1.0 + scale)


def is_nonzero(x: torch.Tensor, ref: torch.Tensor) -> bool:
    """A module's own output is zero or not whatever its dtype (the float32 threshold): a bfloat16 model's
    small random-weight MLP output is no rounding residue."""
    return float(x.float().abs().max()) > 1e-4 * (1.0 + float(ref.float().abs().max()))


def plus(x: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor | None:
    """``x + y`` where both are states of one shape (None otherwise: no broadcasting a head axis)."""
    return x + y if x is not None and y is not None and x.shape == y.shape else None


def stream_scale(y: torch.Tensor | None, x: torch.Tensor | None) -> float | None:
    """The factor ``s`` with ``x = s · y`` (1.0 when ``x`` is ``y``): a block's output ``y`` and what the
    next block (or the final norm) receives, ``x``. RWKV halves its stream every ``rescale_every`` blocks.
    None when ``x`` is no multiple of ``y``."""
    if y is None or x is None:
        return None
    if close(x, y):
        return 1.0
    if x.shape != y.shape or not x.is_floating_point():
        return None
    yf, xf = y.float(), x.float()
    ok = torch.isfinite(yf) & torch.isfinite(xf)
    denom = float((yf[ok] * yf[ok]).sum())
    if denom == 0:
        return None
    s = float((yf[ok] * xf[ok]).sum()) / denom
    return s if s != 0 and close(x, y * s) else None
