"""Each post-processing of :mod:`geometry.postprocess` as a chunk → chunk function in float32, fitted
from a layer's moments (:class:`geometry.moments.Moments`), with what is known of its covariance
without touching the rows again.

- standardise: the standard deviations; covariance: the correlation matrix.
- ZCA whitening: one ``eigh`` of the covariance; the whitened covariance W C W = V diag(λ/(λ⁺ +
  floor)) Vᵀ has those eigenvalues, so its top-PC share needs no second eigensolver (``spectrum``),
  and neither does the raw one (λ).
- remove-top: the rogue dimensions (raw cosine contributions); covariance: a sub-matrix.
- clip: median and MAD of a strided sample, as :func:`geometry.clip_outliers`; non-linear, so its
  covariance is None here and accumulated over the clipped rows by the caller.
"""

from __future__ import annotations

import numpy as np
import torch

from lens.runtime.threads import serial

from .postprocess import POSTPROCESSING

__all__ = ["Transforms", "top_share"]


def top_share(cov: torch.Tensor | None = None, spectrum: torch.Tensor | None = None) -> float:
    """Largest eigenvalue over the sum of the (non-negative parts of the) eigenvalues, of ``cov`` or
    from its ``spectrum`` when known (any order: sorted ascending first, as ``eigvalsh`` returns
    them, so the sum adds them in the same order)."""
    if spectrum is not None:
        ev = torch.sort(spectrum).values.clamp(min=0)
    else:
        with serial(cov.device):
            ev = torch.linalg.eigvalsh(cov).clamp(min=0)
    return float(ev[-1] / ev.sum())


class Transforms:
    """``fns[pp]``: chunk → post-processed chunk (float32); ``cov[pp]``: its covariance (None:
    accumulate it, or known through ``spectrum[pp]``, its eigenvalues); ``sums[pp]``, for the affine
    ones (x ↦ (x − μ) A, every one but a real clip): ``(S, m)`` ↦ the post-processed rows' group
    sums from the raw rows' group sums ``S`` (float64, group × d) and the group sizes ``m`` — the
    same parameters as ``fns``, in float64."""

    def __init__(self, X: torch.Tensor, mom, pps: tuple, k: int, n_sigma: float = 6.0, eps_whiten: float = 1e-6):
        self.fns, self.cov, self.spectrum, self.sums = {}, {}, {}, {}
        for pp in pps:
            fit = getattr(self, f"_{pp}", None) if pp in _NAMES else None
            if fit is None:
                raise ValueError(f"unknown post-processing {pp!r}; expected one of {POSTPROCESSING}")
            fit(pp, X, mom, k=k, n_sigma=n_sigma, eps_whiten=eps_whiten)

    def _raw(self, pp, X, mom, **_):
        self.fns[pp] = lambda C: C
        self.cov[pp] = mom.cov
        self.sums[pp] = lambda S, m: S

    def _standardize(self, pp, X, mom, **_):
        sd = mom.cov.diagonal().clamp(min=0).sqrt()
        sd = torch.where(sd > 1e-12, sd, torch.ones_like(sd))
        mu32, sd32 = mom.mean.to(torch.float32), sd.to(torch.float32)
        self.fns[pp] = lambda C, mu32=mu32, sd32=sd32: (C - mu32) / sd32
        self.cov[pp] = mom.cov / torch.outer(sd, sd)
        mu, sdw = mu32.to(torch.float64), sd32.to(torch.float64)
        self.sums[pp] = lambda S, m, mu=mu, sdw=sdw: (S - m[:, None] * mu) / sdw

    def _whiten(self, pp, X, mom, *, eps_whiten, **_):
        with serial(X.device):
            evals, evecs = torch.linalg.eigh(mom.cov)
        lam = evals.clamp(min=0)
        floor = max(eps_whiten * float(lam.mean()), 1e-300)
        W = ((evecs * (1.0 / torch.sqrt(lam + floor))) @ evecs.T).to(torch.float32)
        mu32 = mom.mean.to(torch.float32)
        self.fns[pp] = lambda C, mu32=mu32, W=W: (C - mu32) @ W
        self.cov[pp] = None
        mu, W64 = mu32.to(torch.float64), W.to(torch.float64)
        self.sums[pp] = lambda S, m, mu=mu, W64=W64: (S - m[:, None] * mu) @ W64
        self.spectrum[pp] = evals / (lam + floor)
        self.spectrum["raw"] = evals  # the raw covariance's too: no eigvalsh for the raw top-PC share

    def _remove_top(self, pp, X, mom, *, k, **_):
        if not 0 <= k < mom.d:
            raise ValueError(f"k must be between 0 and d_model - 1 = {mom.d - 1}; got {k}")
        top = np.argsort(-mom.cc.cpu().numpy(), kind="stable")[:k]
        keep = torch.ones(mom.d, dtype=torch.bool, device=X.device)
        keep[torch.as_tensor(top, dtype=torch.long, device=X.device)] = False
        cols = torch.nonzero(keep).flatten()  # index_select: the same columns as C[:, keep], in half the time
        self.fns[pp] = lambda C, cols=cols: C.index_select(1, cols)
        self.cov[pp] = mom.cov[keep][:, keep]
        self.sums[pp] = lambda S, m, keep=keep: S[:, keep]

    def _clip(self, pp, X, mom, *, n_sigma, **_):
        flat = X.flatten()
        if flat.numel() > 4_000_000:  # a strided sample is plenty for two quantiles
            flat = flat[:: flat.numel() // 4_000_000 + 1]
        med = flat.median().to(torch.float64)  # an element: the same as the float64 copy's median, sooner
        mad = (flat.to(torch.float64) - med).abs().median() * 1.4826
        if float(mad) == 0.0:
            self.fns[pp] = lambda C: C
            self.cov[pp] = mom.cov
            self.sums[pp] = lambda S, m: S
        else:
            lo, hi = float(med - n_sigma * mad), float(med + n_sigma * mad)
            self.fns[pp] = lambda C, lo=lo, hi=hi: C.clamp(min=lo, max=hi)
            self.cov[pp] = None  # non-linear: accumulated over the clipped rows


_NAMES = ("raw", "standardize", "whiten", "remove_top", "clip")
