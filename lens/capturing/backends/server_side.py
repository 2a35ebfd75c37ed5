"""What runs where the model runs (on NDIF, inside the nnsight trace): the reductions of one site's tensor.

nnsight ships the traced block to the server as source, with the objects it names. Everything the
block calls must exist there: torch does, lens does not. This module therefore imports nothing but
torch, and :mod:`lens.capturing.backends.nnsight_backend` registers it with ``nnsight.register`` so that its
functions travel by source with each request (``remote="local"`` replays that round trip here,
with lens hidden, and the tests run it).

Reductions (one per request, for every tap):

* ``ROWS`` — the selected rows, ``(rows, width)`` in the model's dtype.
* ``MOMENTS`` — per-site sums of the selected rows X (``m`` rows) for the statistics of
  :mod:`lens.store.layer_stats`: a ``(5, width)`` float64 block (shift = the rows' mean, Σ(x − shift),
  Σ û, Σ û², and a row holding [Σ‖x‖², number of all-zero rows, 0, ...]), with û = x/‖x‖ (0 for a
  zero row).
* ``MOMENTS_COV`` — the same plus the upper triangle (row-major, as ``numpy.triu_indices``) of the
  Gram matrix Σ(x − shift)(x − shift)ᵀ in float32: centred about the rows' own mean first, the
  float32 products keep the variance from cancelling against a large mean (as
  ``geometry.moments`` does per chunk). Half of d² is what makes a covariance expensive to bring
  back: worth it only when a request holds more than about width/2 rows per site.
"""

from __future__ import annotations

import torch

ROWS = "rows"
MOMENTS = "moments"
MOMENTS_COV = "moments+cov"
REDUCTIONS = (ROWS, MOMENTS, MOMENTS_COV)
SUM_ROWS = 5  # rows of the float64 block a MOMENTS reduction returns


def payload(reduction: str, n_rows: int, width: int, itemsize: int) -> int:
    """Bytes one site's reduction brings back (``itemsize``: the model's dtype, for ``ROWS``)."""
    if reduction == ROWS:
        return int(n_rows) * width * itemsize
    size = SUM_ROWS * width * 8
    if reduction == MOMENTS_COV:
        size += width * (width + 1) // 2 * 4
    return size


def take_rows(value: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows ``index`` (flat batch·seq positions) of a (batch, seq, width) or (batch·seq, width) tensor."""
    return value.reshape(-1, value.shape[-1]).index_select(0, index.to(value.device))


def moment_sums(value: torch.Tensor, index: torch.Tensor, gram: bool):
    """``(sums, triangle)`` of the rows ``index`` (see the module docstring); ``triangle`` is None
    without ``gram``."""
    X = take_rows(value, index).to(torch.float32)
    m, d = X.shape
    shift = X.sum(dim=0, dtype=torch.float64) / max(m, 1)
    Z = X - shift.to(torch.float32)
    norms = torch.linalg.vector_norm(X, dim=1)
    U = X / norms.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(1)
    sums = torch.zeros((SUM_ROWS, d), dtype=torch.float64, device=X.device)
    sums[0] = shift
    sums[1] = Z.sum(dim=0, dtype=torch.float64)
    sums[2] = U.sum(dim=0, dtype=torch.float64)
    sums[3] = (U * U).sum(dim=0, dtype=torch.float64)
    sums[4, 0] = (norms.to(torch.float64) ** 2).sum()
    sums[4, 1] = (norms == 0).sum().to(torch.float64)
    if not gram:
        return sums, None
    upper = torch.ones((d, d), dtype=torch.bool, device=X.device).triu()
    return sums, (Z.T @ Z).masked_select(upper)
