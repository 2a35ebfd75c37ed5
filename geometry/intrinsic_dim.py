"""Intrinsic-dimension estimators on torch: TwoNN and MLE (Levina–Bickel), plus scikit-dimension by name.

Conventions (fixed once here)
-----------------------------
- Input ``X`` is ``(n_samples, n_features)``: numpy, torch (any device, any float dtype) or lists.
  Computation happens on ``X``'s device unless ``device=`` says otherwise.
- Exact duplicate rows are dropped before estimation (first copy kept); how many is in
  ``n_duplicates_`` and the rows used are ``sample_index_``. A duplicate has zero distance to its
  copy, which makes TwoNN's ratio r2/r1 infinite and MLE's log(r_k / r_j) infinite.
- The conventions of scikit-dimension 0.5 are matched exactly, so that both give the same number on
  the same points (tested to agree within 2%):

  * ``TwoNN`` (Facco et al. 2017, Sci. Rep. 7:12140): μ_i = r2/r1; the largest
    ``discard_fraction`` of the μ are dropped; ``method="linear"`` fits, through the origin, the
    line −log(1 − F_emp(μ)) = d·log μ with F_emp(μ_(i)) = i / N (N = all points, before
    discarding); ``method="mle"`` is the censored maximum-likelihood estimate
    (k − 1) / (Σ_{i≤k} log μ_(i) + (N − k) log μ_(k)) (Denti et al. 2022).
  * ``MLE`` (Levina & Bickel 2005): the local estimate at x from its k nearest neighbours is
    m_k(x) = (k − 1) / Σ_{j<k} log(T_k(x) / T_j(x)); the global estimate averages the *inverse*
    local estimates, d = 1 / mean(1 / m_k(x)), as MacKay & Ghahramani (2005) showed is the
    correct maximum-likelihood combination (skdim's ``comb="mle"``). ``comb="mean"`` and
    ``"median"`` are also available; ``unbiased=True`` uses k − 2 in the numerator.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator

from .arrays import to_numpy
from .neighbors import NeighborGraph, neighbor_graph, prepare_points

__all__ = ["TwoNN", "MLE", "prepare_points", "skdim_estimator", "SKDIM_ESTIMATORS", "make_estimator",
           "uses_neighbor_graph"]

log = logging.getLogger(__name__)

#: scikit-dimension estimators available through :func:`skdim_estimator` (names as skdim spells them).
SKDIM_ESTIMATORS = (
    "CorrInt", "DANCo", "ESS", "FisherS", "GRIDE", "KNN", "lPCA", "MADA", "MiND_ML",
    "MLE", "MOM", "PH", "TLE", "TwoNN",
)  # fmt: skip


class _GraphEstimator(BaseEstimator):
    """What :class:`TwoNN` and :class:`MLE` share: the neighbour search's settings (``chunk_size``, ``device``,
    ``precision``, ``progress``), the search itself and the fitted attributes it gives."""

    graph_what: str  # how the search names the estimator in its errors

    def _search_settings(self, chunk_size: int, device: str | None, precision: str, progress: bool) -> None:
        self.chunk_size = chunk_size
        self.device = device
        self.precision = precision
        self.progress = progress

    def _graph(self, X: Any, k: int, **kw: Any) -> NeighborGraph:
        return neighbor_graph(X, k, what=self.graph_what, device=self.device, chunk_size=self.chunk_size,
                              precision=self.precision, progress=self.progress, **kw)

    def _fitted_points(self, graph: NeighborGraph) -> None:
        self.sample_index_ = graph.sample_index.cpu().numpy()
        self.n_duplicates_ = graph.n_duplicates
        self.n_features_in_ = graph.n_features


class TwoNN(_GraphEstimator):
    """TwoNN intrinsic-dimension estimator (Facco et al. 2017) with chunked torch neighbour search.

    Parameters
    ----------
    discard_fraction : fraction of the largest ratios μ = r2/r1 to discard (skdim default 0.1).
    method : ``"linear"`` (regression of Facco et al., skdim default) or ``"mle"``.
    chunk_size : rows per distance tile (memory ≈ chunk_size² × 4 bytes).
    device : compute device; ``None`` keeps ``X``'s own device.
    precision : precision of the neighbour search (:func:`geometry.neighbors.knn`; same answer).
    progress : show a progress bar over tiles.

    ``fit_graph(graph)`` fits from a :class:`geometry.neighbors.NeighborGraph` already computed
    (with at least 2 neighbours), e.g. one shared with :class:`MLE`.

    Fitted attributes
    -----------------
    dimension_ : float, the estimate.
    mu_ : (n_points,) float64 ratios r2/r1, one per distinct point, in input order.
    sample_index_ : (n_points,) int64, the rows of ``X`` used (duplicates removed).
    n_duplicates_ : int, exact duplicate rows dropped.
    n_features_in_ : int.
    """

    def __init__(
        self,
        discard_fraction: float = 0.1,
        method: str = "linear",
        chunk_size: int = 2048,
        device: str | None = None,
        precision: str = "auto",
        progress: bool = False,
    ):
        self.discard_fraction = discard_fraction
        self.method = method
        self._search_settings(chunk_size, device, precision, progress)

    #: neighbours per point this estimator reads from a neighbour graph
    @property
    def neighbors_needed(self) -> int:
        return 2

    @property
    def graph_what(self) -> str:
        return "TwoNN"

    def _check_params(self) -> None:
        if self.method not in ("linear", "mle"):
            raise ValueError(f"method must be 'linear' or 'mle'; got {self.method!r}")
        if not 0.0 <= self.discard_fraction < 1.0:
            raise ValueError(f"discard_fraction must be in [0, 1); got {self.discard_fraction}")

    def fit(self, X: Any, y: Any = None) -> "TwoNN":
        self._check_params()
        return self.fit_graph(self._graph(X, 2, min_points=3))

    def fit_graph(self, graph: NeighborGraph) -> "TwoNN":
        """Fit from a neighbour graph of the points (its first two neighbours are read)."""
        self._check_params()
        dist = graph.first(2).distances
        mu = (dist[:, 1] / dist[:, 0]).cpu()
        self.dimension_ = float(twonn_from_ratios(mu, self.discard_fraction, self.method))
        self.mu_ = mu.numpy()
        self._fitted_points(graph)
        return self


def twonn_from_ratios(mu: torch.Tensor, discard_fraction: float, method: str) -> float:
    """The TwoNN estimate from the ratios μ = r2/r1 (see the module docstring for the formulas)."""
    mu = mu.to(torch.float64)
    N = mu.numel()
    n_keep = int(N * (1 - discard_fraction))
    if n_keep < 2:
        raise ValueError(
            f"TwoNN needs at least 2 ratios left after discarding {discard_fraction:.0%}; "
            f"got {n_keep} of {N}"
        )
    log_mu = torch.sort(torch.log(mu)).values[:n_keep]
    if method == "mle":
        return float((n_keep - 1) / (log_mu.sum() + (N - n_keep) * log_mu[-1]))
    F = torch.arange(1, n_keep + 1, dtype=torch.float64) / N
    y = -torch.log1p(-F)
    # least squares through the origin: slope = Σxy / Σx²
    return float((log_mu * y).sum() / (log_mu * log_mu).sum())


class MLE(_GraphEstimator):
    """Levina–Bickel maximum-likelihood intrinsic dimension, MacKay–Ghahramani averaging.

    Parameters
    ----------
    n_neighbors : k, neighbours per point (skdim default 20).
    comb : ``"mle"`` (harmonic mean of local estimates; MacKay & Ghahramani 2005), ``"mean"`` or
        ``"median"``.
    unbiased : use k − 2 instead of k − 1 in the local estimate (Levina & Bickel's unbiased form).
    chunk_size, device, precision, progress : as for :class:`TwoNN`; ``fit_graph`` likewise (the
        graph needs at least ``n_neighbors`` neighbours).

    Fitted attributes
    -----------------
    dimension_ : float. dimension_pw_ : (n_points,) local estimates, in input order.
    sample_index_, n_duplicates_, n_neighbors_, n_features_in_ : as for :class:`TwoNN`.
    """

    def __init__(
        self,
        n_neighbors: int = 20,
        comb: str = "mle",
        unbiased: bool = False,
        chunk_size: int = 2048,
        device: str | None = None,
        precision: str = "auto",
        progress: bool = False,
    ):
        self.n_neighbors = n_neighbors
        self.comb = comb
        self.unbiased = unbiased
        self._search_settings(chunk_size, device, precision, progress)

    @property
    def neighbors_needed(self) -> int:
        return int(self.n_neighbors)

    @property
    def graph_what(self) -> str:
        return f"MLE with n_neighbors={self.n_neighbors}"

    def _check_params(self) -> int:
        if self.comb not in ("mle", "mean", "median"):
            raise ValueError(f"comb must be 'mle', 'mean' or 'median'; got {self.comb!r}")
        k = int(self.n_neighbors)
        if k < 2 or k != self.n_neighbors:
            raise ValueError(f"n_neighbors must be an integer >= 2; got {self.n_neighbors!r}")
        return k

    def fit(self, X: Any, y: Any = None) -> "MLE":
        k = self._check_params()
        return self.fit_graph(self._graph(X, k))

    def fit_graph(self, graph: NeighborGraph) -> "MLE":
        """Fit from a neighbour graph of the points (its first ``n_neighbors`` neighbours are read)."""
        k = self._check_params()
        dist = graph.first(k).distances
        # m_k(x) = (k-1) / Σ_{j<=k} log(T_k / T_j); the j = k term is log 1 = 0.
        log_ratio = torch.log(dist[:, -1:] / dist).sum(dim=1)
        kfac = k - 2 if self.unbiased else k - 1
        pw = (kfac / log_ratio).cpu()
        if self.comb == "mle":
            dim = 1.0 / torch.mean(1.0 / pw)
        elif self.comb == "mean":
            dim = pw.mean()
        else:
            dim = pw.median()
        self.dimension_ = float(dim)
        self.dimension_pw_ = pw.numpy()
        self._fitted_points(graph)
        self.n_neighbors_ = k
        return self


def uses_neighbor_graph(est: Any) -> bool:
    """Whether ``est`` can be fitted from a shared :class:`NeighborGraph` (``fit_graph``)."""
    return hasattr(est, "fit_graph") and hasattr(est, "neighbors_needed")


class _SkdimAdapter(BaseEstimator):
    """Runs a scikit-dimension estimator on numpy copies of the input, after the same checks.

    ``fit_params`` go to skdim's ``fit`` (e.g. ``{"n_neighbors": 20}`` for skdim's local estimators).
    """

    def __init__(self, name: str, params: dict | None = None, fit_params: dict | None = None):
        self.name = name
        self.params = params
        self.fit_params = fit_params

    def fit(self, X: Any, y: Any = None) -> "_SkdimAdapter":
        import skdim.id  # lazy: import cost (skdim ~0.5 s on every `import geometry`; its estimators only)

        U, kept, n_dup = prepare_points(X, min_points=3, what=f"skdim {self.name}")
        est = getattr(skdim.id, self.name)(**(self.params or {}))
        est.fit(to_numpy(U).astype(np.float64), **(self.fit_params or {}))
        self.estimator_ = est
        self.dimension_ = float(est.dimension_)
        self.sample_index_ = kept.cpu().numpy()
        self.n_duplicates_ = n_dup
        self.n_features_in_ = U.shape[1]
        return self


def skdim_estimator(name: str, fit_params: dict | None = None, **params: Any) -> _SkdimAdapter:
    """A scikit-dimension estimator by name (``"lPCA"``, ``"DANCo"``, ``"ESS"``, ...).

    The returned object follows the same contract as :class:`TwoNN` (``fit(X).dimension_``,
    ``n_duplicates_``), accepts torch tensors, and drops duplicate rows first.
    """
    canon = {n.lower(): n for n in SKDIM_ESTIMATORS}
    if name.lower() not in canon:
        raise ValueError(f"unknown scikit-dimension estimator {name!r}; expected one of {SKDIM_ESTIMATORS}")
    return _SkdimAdapter(canon[name.lower()], params=params or None, fit_params=fit_params)


def make_estimator(name: str, **params: Any) -> BaseEstimator:
    """``"twonn"`` and ``"mle"`` give ours; any other name goes to :func:`skdim_estimator`.

    Prefix a name with ``"skdim:"`` (e.g. ``"skdim:TwoNN"``) to force the scikit-dimension version.
    """
    key = name.lower()
    if key == "twonn":
        return TwoNN(**params)
    if key == "mle":
        return MLE(**params)
    if key.startswith("skdim:"):
        return skdim_estimator(name[6:], **params)
    return skdim_estimator(name, **params)
