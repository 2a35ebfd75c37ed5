"""Per-row softmax statistics of a (token, vocab) logits chunk, fused into one kernel where possible.

The lens metrics need, for every token row of a layer's logits: the max and argmax, the partition
sum ``z = Σ exp(l − max)``, ``Σ exp(l − max)·(l − max)`` (for the entropy) and the rank of the true
token (how many logits beat it). Done as separate torch ops on the CPU these are eight passes over a
chunk × 49k-vocabulary array and cost more than the unembedding matmul itself (measured: 440 ms of
ops after a 300 ms matmul per 512-token chunk of SmolLM2). Compiled with ``torch.compile`` (inductor
fuses them into two passes with a vectorised exp: a row max, then everything else) the same
statistics take about a fifth of that (0.2 × the matmul, measured on one core).

:func:`row_stats` picks the compiled kernel when asked (``fused=True``), or by default on the CPU
for large jobs; compilation costs ~5 s with inductor's on-disk cache warm (~40 s cold), so small jobs
and CUDA (where the eager ops are already cheap) stay eager. If compilation fails — no C++ compiler,
say — it logs a warning once and falls back to the eager ops, which give the same numbers.
``LENS_NO_COMPILE=1`` disables compilation.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

log = logging.getLogger(__name__)

# exp() of arguments below about -87 (float32 underflow) takes a slow path in the vectorised CPU
# kernel — 10x slower measured here, even with flush-to-zero — and peaked intermediate-layer logits
# put most of the vocabulary there. Clamping at -80 changes each probability by < 2e-35.
EXP_FLOOR = -80.0

# token·layer count above which the CPU lens compiles the fused kernel by default (below it, the
# compile time is not won back).
FUSE_MIN_WORK = 32_768


def _stats(logits: torch.Tensor, t_logit: torch.Tensor):
    """(max, argmax, z, Σ e·s, rank) per row; pure (no in-place ops), the body that gets compiled.

    The argmax is the first column where ``s == 0`` (ties: the first, as ``torch.max``), taken in the
    same loop as the sums: inductor vectorises ``amax`` but not a (max, argmax) reduction, which cost
    as much as the whole exp-sum loop (measured: 35 ms vs 11 ms for ``amax`` on 512 × 49152)."""
    mx = logits.amax(-1)
    s = logits - mx[:, None]
    e = s.clamp_min(EXP_FLOOR).exp()
    z = e.sum(-1)
    es = (e * s).sum(-1)
    col = torch.arange(logits.shape[-1], device=logits.device, dtype=torch.int32)
    am = torch.where(s == 0, col, logits.shape[-1] - 1).amin(-1).long()
    rank = (logits > t_logit[:, None]).sum(-1, dtype=torch.int32)
    return mx, am, z, es, rank


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax along the last axis (autograd-safe) without the slow underflowing exp (see EXP_FLOOR)."""
    mx = logits.detach().amax(-1, keepdim=True)
    shifted = logits - mx
    return shifted - shifted.clamp_min(EXP_FLOOR).exp().sum(-1, keepdim=True).log()


class _KLToReference(torch.autograd.Function):
    """Mean over rows of KL(p_ref ‖ softmax(logits)) with its gradient in one saved tensor.

    ``KL = Σ p_ref log p_ref − Σ p_ref · logits + (Σ p_ref) logsumexp(logits)`` (``Σ p_ref`` is 1 only up
    to float32 rounding, ~1e-4 over a 49k vocabulary: not assumed) and its gradient with respect to
    the logits is ``(softmax(logits) − p_ref) / rows``: the forward keeps ``exp(logits − max)`` and its
    row sums, the backward turns them into that gradient in place. Autograd through
    :func:`log_softmax` makes about three times as many passes over the (rows, vocab) array (the
    tuned lens' training steps spent most of their time there, not in the unembedding products)."""

    @staticmethod
    def forward(ctx, logits, p_ref, ref_negentropy):
        x = logits.float()
        mx = x.detach().amax(-1, keepdim=True)
        e = (x - mx).clamp_min_(EXP_FLOOR).exp_()
        z = e.sum(-1, keepdim=True)
        lse = mx[:, 0] + z[:, 0].log()
        ctx.save_for_backward(e, z, p_ref)
        ctx.dtype = logits.dtype
        # vecdot, not the BLAS row dot: at training-batch shapes (128 × 49k) one streaming pass is
        # 3.7× faster than bmm's (measured 3.8 vs 14 ms on one core; the same sums to float32 rounding)
        return (ref_negentropy - torch.linalg.vecdot(p_ref, x) + p_ref.sum(-1) * lse).mean()

    @staticmethod
    def backward(ctx, grad):
        e, z, p_ref = ctx.saved_tensors
        g = e.div_(z).sub_(p_ref).mul_(grad / e.shape[0])
        return g.to(ctx.dtype), None, None


def kl_to_reference(logits: torch.Tensor, p_ref: torch.Tensor, ref_negentropy: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(p_ref ‖ softmax(logits)) in nats (autograd-safe with respect to ``logits``).

    ``p_ref`` (rows, vocab) float32 probabilities, ``ref_negentropy`` (rows,) their Σ p log p; the
    logits may be bfloat16 (computed in float32, the gradient returned in their dtype). Equal to
    ``(ref_negentropy − (p_ref · log_softmax(logits)).sum(-1)).mean()`` up to float32 rounding."""
    return _KLToReference.apply(logits, p_ref, ref_negentropy)


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dot product through BLAS (one pass, no chunk × vocab temporary)."""
    return torch.bmm(a[:, None, :], b[:, :, None])[:, 0, 0]


def _stats_eager(logits: torch.Tensor, t_logit: torch.Tensor):
    """The same statistics as separate ops with one chunk × vocab temporary (``logits`` is kept)."""
    mx, am = logits.max(-1)
    rank = (logits > t_logit[:, None]).sum(-1, dtype=torch.int32)  # int32 accumulation: 2x faster than int64
    s = logits - mx[:, None]
    e = s.clamp_min(EXP_FLOOR).exp_()
    z = e.sum(-1)
    es = _rowdot(e, s)
    return mx, am, z, es, rank


class _Compiled:
    lock = threading.Lock()
    fn = None
    failed = False


def _compiled():
    with _Compiled.lock:
        if _Compiled.fn is None and not _Compiled.failed:
            _Compiled.fn = torch.compile(_stats, dynamic=True)
        return _Compiled.fn


def use_fused(device: torch.device, work: int, fused: bool | None) -> bool:
    """Whether :func:`row_stats` should run compiled for a job of ``work`` token·layers."""
    if os.environ.get("LENS_NO_COMPILE") or _Compiled.failed:
        return False
    if fused is not None:
        return bool(fused)
    return torch.device(device).type == "cpu" and work >= FUSE_MIN_WORK


def row_stats(logits: torch.Tensor, t_logit: torch.Tensor, fused: bool = False):
    """(max, argmax, z, Σ exp(s)·s, rank) of each row of ``logits`` (float32), with ``s = l − max``,
    ``z = Σ exp(s)`` (arguments clamped at EXP_FLOOR) and ``rank = #{v : l_v > t_logit}``."""
    if fused:
        fn = _compiled()
        if fn is not None:
            try:
                return fn(logits, t_logit)
            except Exception as exc:  # noqa: BLE001 — any compiler failure: fall back, same numbers
                _Compiled.failed = True
                log.warning("torch.compile of the lens statistics failed (%s: %s); using eager ops",
                            type(exc).__name__, exc)
    return _stats_eager(logits, t_logit)
