"""Token linearity between consecutive layers.

Definitions
-----------
- Normalisation (Razzhigaev et al. 2024, "Your Transformer is Secretly Linear"): centre a
  ``(token, d_model)`` matrix by its column means and scale it to unit Frobenius norm: X̃, Ỹ.
- ``linearity_score(X, Y) = 1 − ‖X̃A − Ỹ‖²_F`` with A the least-squares map X̃ → Ỹ (in sample,
  as in the paper). An exactly linear (affine) relation scores 1; the paper reports ≈ 0.99 between
  consecutive layers of decoders.
- Centred variant: ``linearity_score(H_l, H_{l+1} − H_l)``, the linearity of the residual update
  alone, which removes the identity path that makes the plain score high (same paper).
- Per-token nonlinearity (LLM-Microscope, Razzhigaev et al. 2025): the residual of token i under
  the fitted map, ``‖(X̃A − Ỹ)_i‖``. We multiply by √n so the values do not shrink with the number
  of tokens; with this scaling mean_i(nonlinearity_i²) = 1 − linearity_score.
- A least-squares map from n tokens in d > n − 1 dimensions fits anything exactly; such input is
  rejected unless ``ridge > 0``.

Cost of a profile (``linearity_profile``): every layer is converted, checked and normalised once
(it is the target of one transition and the source of the next), and a transition costs one Gram
matrix, its eigendecomposition and two n × d × d products. The centred score needs no second
regression: with X̃, Ỹ the normalised H_l, H_{l+1} and U the centred update H_{l+1} − H_l,
Ũ = (‖H_{l+1}‖ Ỹ − ‖H_l‖ X̃)/‖U‖ (norms of the centred matrices); the least-squares map fits X̃
itself exactly, so the residual of Ũ is (‖H_{l+1}‖/‖U‖)(X̃A − Ỹ) and
``linearity_centered = 1 − (‖H_{l+1}‖/‖U‖)² (1 − linearity)``. That holds when no direction of X̃
is dropped (measured ≤ 5e-16 relative to the explicit fit on SmolLM2 states); with a ridge, or
dropped directions, the update is regressed explicitly.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .arrays import as_matrix, check_finite_rows, lapack_threads, to_numpy

__all__ = [
    "normalize_frobenius", "linearity_score", "token_nonlinearity", "LinearityProfile",
    "linearity_profile", "linearity_scores", "nonlinearity_profile", "GroupMeans", "aggregate_by_token", "group_means",
]  # fmt: skip

log = logging.getLogger(__name__)


def _centred(X: torch.Tensor, inplace: bool = False) -> tuple[torch.Tensor, float]:
    """Column-centred float64 ``X`` and its Frobenius norm (ValueError when it is zero);
    ``inplace``: centre a float64 ``X`` the caller no longer needs in place (same values)."""
    X = X.to(torch.float64)
    Xc = X.sub_(X.mean(dim=0, keepdim=True)) if inplace else X - X.mean(dim=0, keepdim=True)
    norm = torch.linalg.matrix_norm(Xc)
    if float(norm) == 0.0:
        raise ValueError("cannot normalise a matrix whose rows are all identical (zero variance)")
    return Xc, norm


def normalize_frobenius(X: torch.Tensor) -> torch.Tensor:
    """Centre columns and scale to unit Frobenius norm (float64)."""
    Xc, norm = _centred(X)
    return Xc / norm


def _pair(X: Any, Y: Any, ridge: float, device: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    Xt = as_matrix(X, "X", device=device, min_rows=2)
    Yt = as_matrix(Y, "Y", device=device or Xt.device, min_rows=2)
    if Xt.shape[0] != Yt.shape[0]:
        raise ValueError(f"X and Y must hold the same tokens (rows); got {Xt.shape[0]} and {Yt.shape[0]}")
    check_finite_rows(Xt, "X")
    check_finite_rows(Yt, "Y")
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0; got {ridge}")
    if ridge == 0 and Xt.shape[0] - 1 <= Xt.shape[1]:
        raise ValueError(
            f"a least-squares map needs more tokens than dimensions (n_tokens - 1 > d) to be "
            f"non-trivial; got n_tokens={Xt.shape[0]}, d={Xt.shape[1]}. Use more tokens or ridge > 0."
        )
    return normalize_frobenius(Xt), normalize_frobenius(Yt)


ROW_CHUNK = 8192  # rows of a residual formed at once in a profile (its n × d whole would be one more layer)


class _LeastSquares:
    """The least-squares (or ridge) map from the normalised ``Xn`` to any ``Yn``, through one
    eigendecomposition of the Gram matrix ``Xnᵀ Xn`` (d × d, float64), so every target regressed on
    the same source (the plain and the centred score of a transition) shares it.

    ``A = V diag(w) Vᵀ Xnᵀ Yn`` with ``w = 1 / (λ + ridge)``; without a ridge, directions whose
    eigenvalue is below ``max(n, d) · eps · λ_max`` are dropped (w = 0): the minimum-norm
    least-squares solution, which also handles the rank deficiency centring introduces (rank ≤ n − 1)
    and degenerate directions, as a rank-revealing QR does. Cost: three n × d × d products, against a
    column-pivoted QR (BLAS-2 bound) per target before; the residuals agree with LAPACK's gelsy to
    float64 rounding × cond(Xn)² (tests/geometry/test_linearity_metrics.py)."""

    def __init__(self, Xn: torch.Tensor, ridge: float, gram: torch.Tensor | None = None):
        self.Xn = Xn
        self.ridge = ridge
        G = Xn.T @ Xn if gram is None else gram  # ``gram``: Xnᵀ Xn already summed (over row groups)
        with lapack_threads(Xn.device):
            lam, self.V = torch.linalg.eigh(G)
        self.lam = lam
        if ridge > 0:
            self.w = 1.0 / (lam.clamp(min=0) + ridge)
        else:
            tol = max(Xn.shape) * torch.finfo(Xn.dtype).eps * float(lam.max().clamp(min=0))
            self.w = torch.where(lam > tol, 1.0 / lam.clamp(min=tol), torch.zeros_like(lam))

    def _map(self, Yn: torch.Tensor, cross: torch.Tensor | None = None) -> torch.Tensor:
        """A (d × d') for the target ``Yn`` (``cross``: Xnᵀ Yn already summed)."""
        return (self.V * self.w) @ (self.V.T @ (self.Xn.T @ Yn if cross is None else cross))

    def residual_norms(self, Yn: torch.Tensor, cross: torch.Tensor | None = None) -> torch.Tensor:
        """‖(X̃A − Ỹ)_i‖ per row, the residual formed :data:`ROW_CHUNK` rows at a time (never whole)."""
        B = self._map(Yn, cross)
        return torch.cat([torch.linalg.vector_norm((self.Xn[a:a + ROW_CHUNK] @ B).sub_(Yn[a:a + ROW_CHUNK]), dim=1)
                          for a in range(0, Yn.shape[0], ROW_CHUNK)])

    @property
    def keeps_span(self) -> bool:
        """True when the map reproduces X̃ itself exactly (least squares, no direction dropped)."""
        return self.ridge == 0 and bool((self.w > 0).all())


def linearity_score(X: Any, Y: Any, *, ridge: float = 0.0, device: str | None = None) -> float:
    """1 − ‖X̃A − Ỹ‖²_F for normalised ``X``, ``Y`` of shape ``(token, d)`` (see module docstring)."""
    Xn, Yn = _pair(X, Y, ridge, device)
    r = _LeastSquares(Xn, ridge).residual_norms(Yn)  # as linearity_profile computes it
    return float(1.0 - (r * r).sum())


def token_nonlinearity(X: Any, Y: Any, *, ridge: float = 0.0, device: str | None = None) -> np.ndarray:
    """Per-token nonlinearity √n ‖(X̃A − Ỹ)_i‖, shape ``(token,)``."""
    Xn, Yn = _pair(X, Y, ridge, device)
    r = _LeastSquares(Xn, ridge).residual_norms(Yn)
    return to_numpy(r * np.sqrt(r.shape[0]))


@dataclass(frozen=True)
class LinearityProfile:
    """Linearity of each transition between consecutive layers.

    Attributes (axes in brackets; ``pair`` p is the transition layers[p] → layers[p + 1])
    ------------------------------------------------------------------------------------
    layers : [layer] the layer labels given.
    source_layers : [pair] layers[:-1], the source layer of each transition.
    linearity : [pair] linearity score of H_l → H_{l+1}.
    linearity_centered : [pair] linearity score of H_l → H_{l+1} − H_l.
    nonlinearity : [pair, token] per-token nonlinearity of H_l → H_{l+1}.
    nonlinearity_mean : [pair] mean over tokens of ``nonlinearity``.
    target_sq : [pair, token] each token's squared row norm of the normalised target Ỹ (they sum to 1 over
        tokens): with ``nonlinearity² / n``, the per-token parts of the score, which a bootstrap over
        documents resamples with the map held fixed (:func:`geometry.nulls.bootstrap_ratio`).
    subset_linearity : [subset, pair] the linearity score refitted on each row subset given to
        :func:`linearity_profile` (``subsets``), as :func:`linearity_scores` on those rows alone gives it (to
        float64 rounding); NaN where the subset cannot be fitted (fewer than 2 rows, no more rows than
        dimensions without a ridge, no variance). None when no subsets were given.
    """

    layers: np.ndarray
    source_layers: np.ndarray
    linearity: np.ndarray
    linearity_centered: np.ndarray
    nonlinearity: np.ndarray
    nonlinearity_mean: np.ndarray
    target_sq: np.ndarray | None = None
    subset_linearity: np.ndarray | None = None


def linearity_profile(
    states: Sequence[Any] | Any,
    *,
    layers: Sequence[int] | None = None,
    ridge: float = 0.0,
    device: str | None = None,
    subsets: Sequence[Any] = (),
) -> LinearityProfile:
    """Linearity, centred linearity and per-token nonlinearity for every consecutive pair of layers.

    ``states`` is a sequence of ``(token, d_model)`` matrices over the same tokens (read one at a
    time when it is lazy, e.g. a store's layer view), or a ``(layer, token, d_model)`` array.
    ``subsets``: boolean row masks whose score is refitted in the same pass (``subset_linearity``; see
    :class:`_RowGroups`) instead of reading every layer again for each.
    """
    mats, labels = _layer_sequence(states, layers)
    groups = _RowGroups(subsets) if len(subsets) else None
    lin, cen, nl, tq, sub = [], [], [], [], []
    for prev, cur, fit, r in _transitions(mats, labels, ridge, device, groups, sub):
        rss = float((r * r).sum())
        lin.append(1.0 - rss)
        nl.append(to_numpy(r * np.sqrt(r.shape[0])))
        tq.append(to_numpy((cur.normalised * cur.normalised).sum(dim=1)))
        if fit.keeps_span:  # the update's residual is a multiple of the plain one (module docstring)
            ratio = float(cur.norm) / _update_norm(prev, cur)
            cen.append(1.0 - ratio * ratio * rss)
        else:
            U = cur.centred_rows(0, None).sub_(prev.centred_rows(0, None))
            rc = fit.residual_norms(U.div_(torch.linalg.matrix_norm(U)))
            del U
            cen.append(float(1.0 - (rc * rc).sum()))
        del prev, cur, fit  # before the next layer is read: two layers held, not three
    nonlin = np.stack(nl)
    return LinearityProfile(
        layers=labels,
        source_layers=labels[:-1],
        linearity=np.asarray(lin),
        linearity_centered=np.asarray(cen),
        nonlinearity=nonlin,
        nonlinearity_mean=nonlin.mean(axis=1),
        target_sq=np.stack(tq),
        subset_linearity=np.asarray(sub, dtype=np.float64).reshape(len(sub), -1).T if groups else None,
    )


def linearity_scores(
    states: Sequence[Any] | Any,
    *,
    layers: Sequence[int] | None = None,
    ridge: float = 0.0,
    device: str | None = None,
) -> np.ndarray:
    """The linearity score of every transition l → l+1 alone ([pair]), equal to
    ``linearity_profile(...).linearity`` at about two thirds of its cost: no residual is formed, the
    residual's total comes from the fit's eigendecomposition, ``‖X̃A − Ỹ‖² = 1 − Σ_k (2w_k − w_k² λ_k)‖M_k‖²``
    with ``M = Vᵀ X̃ᵀ Ỹ`` (for the nested subsamples and the sink-free score, where only the score is read)."""
    mats, labels = _layer_sequence(states, layers)
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0; got {ridge}")
    out = []
    prev = _ProfileLayer(mats[0], f"states[{labels[0]}]", device, ridge)
    for p in range(len(mats) - 1):
        cur = _ProfileLayer(mats[p + 1], f"states[{labels[p + 1]}]", device, ridge, rows=prev.normalised.shape[0])
        fit = _LeastSquares(prev.normalised, ridge)
        M = fit.V.T @ (prev.normalised.T @ cur.normalised)
        w, lam = fit.w, fit.lam.clamp(min=0)
        out.append(float(((2.0 * w - w * w * lam) * (M * M).sum(dim=1)).sum()))  # 1 − rss, with ‖Ỹ‖² = 1
        del fit, M
        prev = cur
    return np.asarray(out)


def nonlinearity_profile(
    states: Sequence[Any] | Any,
    *,
    layers: Sequence[int] | None = None,
    ridge: float = 0.0,
    device: str | None = None,
) -> np.ndarray:
    """Per-token nonlinearity of every transition l → l+1, shape ``(pair, token)``: row p is
    ``token_nonlinearity(states[p], states[p + 1])``, with each layer read and normalised once."""
    mats, labels = _layer_sequence(states, layers)
    out = []
    for step in _transitions(mats, labels, ridge, device):
        r = step[3]
        del step  # its layers, before the next one is read
        out.append(to_numpy(r * np.sqrt(r.shape[0])))
    return np.stack(out)


def _layer_sequence(states, layers) -> tuple[Sequence, np.ndarray]:
    """The layers of ``states`` (indexed lazily when it is a sequence) and their labels."""
    if hasattr(states, "ndim"):
        mats = [states[i] for i in range(states.shape[0])]
    else:
        mats = states if isinstance(states, Sequence) else list(states)
    if len(mats) < 2:
        raise ValueError(f"linearity needs at least 2 layers; got {len(mats)}")
    labels = np.arange(len(mats)) if layers is None else np.asarray(list(layers), dtype=np.int64)
    if len(labels) != len(mats):
        raise ValueError(f"got {len(labels)} layer labels for {len(mats)} state matrices")
    return mats, labels


def _update_norm(prev: "_ProfileLayer", cur: "_ProfileLayer") -> float:
    """‖H_{l+1} − H_l‖ of the centred update, from the two normalised layers (centring is linear: the
    centred update is the difference of the centred layers), :data:`ROW_CHUNK` rows at a time."""
    n = cur.normalised.shape[0]
    ss = sum(float(torch.linalg.matrix_norm(cur.centred_rows(a, a + ROW_CHUNK).sub_(
        prev.centred_rows(a, a + ROW_CHUNK))) ** 2) for a in range(0, n, ROW_CHUNK))
    if ss == 0.0:
        raise ValueError("cannot normalise a matrix whose rows are all identical (zero variance)")
    return ss ** 0.5


def _transitions(mats, labels, ridge: float, device, groups: "_RowGroups | None" = None, scores: list | None = None):
    """For each consecutive pair: (source layer, target layer, the fitted map, the row norms of its
    residual ‖(X̃A − Ỹ)_i‖), every layer prepared once; two normalised layers held at a time. With
    ``groups``, each pair's subset scores are appended to ``scores`` (a list of [subset] arrays)."""
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0; got {ridge}")
    prev = _ProfileLayer(mats[0], f"states[{labels[0]}]", device, ridge)
    for p in range(len(mats) - 1):
        cur = _ProfileLayer(mats[p + 1], f"states[{labels[p + 1]}]", device, ridge, rows=prev.normalised.shape[0])
        if groups is None:
            fit = _LeastSquares(prev.normalised, ridge)
            yield prev, cur, fit, fit.residual_norms(cur.normalised)
        else:
            mom = groups.moments(prev.normalised, cur.normalised)
            scores.append(groups.scores(mom, ridge))
            fit = _LeastSquares(prev.normalised, ridge, gram=mom.G.sum(0))
            yield prev, cur, fit, fit.residual_norms(cur.normalised, cross=mom.C.sum(0))
        del fit  # it holds the source layer: dropped with it before the next layer is read
        prev = cur


@dataclass(frozen=True)
class _GroupMoments:
    """Sums over each row group g of a normalised pair (X̃, Ỹ): n [g], a = Σx̃ [g, d], b = Σỹ [g, d'],
    q = Σ‖ỹ‖² [g], G = Σx̃x̃ᵀ [g, d, d], C = Σx̃ỹᵀ [g, d, d'] (float64)."""

    n: np.ndarray
    a: torch.Tensor
    b: torch.Tensor
    q: torch.Tensor
    G: torch.Tensor
    C: torch.Tensor


class _RowGroups:
    """The rows cut into groups by which of the subsets (boolean masks) hold them, so that one pass over a
    transition gives the fit of every subset: a subset's centred Gram and cross-products follow from its
    groups' sums (Σ over rows of x x̃ᵀ minus n·mean·meanᵀ; the rows are already centred on all rows, which keeps
    that subtraction small), its normalisation from their traces, and its score from one eigendecomposition
    as :func:`linearity_scores` computes it. The groups' Grams also sum to the whole fit's Gram and
    cross-products, so the profile's own map costs no extra product."""

    def __init__(self, subsets: Sequence[Any]):
        masks = np.stack([np.asarray(to_numpy(m), dtype=bool).reshape(-1) for m in subsets])
        pattern = np.packbits(masks, axis=0, bitorder="little")  # each row's membership, as bytes
        keys, inv = np.unique(pattern.T, axis=0, return_inverse=True)
        inv = np.asarray(inv).reshape(-1)
        self.n_rows = masks.shape[1]
        self.rows = [torch.from_numpy(np.flatnonzero(inv == g)) for g in range(len(keys))]
        member = np.unpackbits(keys, axis=1, bitorder="little", count=masks.shape[0]).astype(bool)  # [group, subset]
        self.members = [np.flatnonzero(member[:, k]) for k in range(masks.shape[0])]

    def moments(self, Xn: torch.Tensor, Yn: torch.Tensor) -> _GroupMoments:
        if Xn.shape[0] != self.n_rows:
            raise ValueError(f"subsets: expected masks over {Xn.shape[0]} rows, got {self.n_rows}")
        a, b, q, G, C, n = [], [], [], [], [], []
        for idx in self.rows:
            X = Xn.index_select(0, idx.to(Xn.device))
            Y = Yn.index_select(0, idx.to(Yn.device))
            n.append(len(idx))
            a.append(X.sum(0))
            b.append(Y.sum(0))
            q.append((Y * Y).sum())
            G.append(X.T @ X)
            C.append(X.T @ Y)
        return _GroupMoments(np.asarray(n), torch.stack(a), torch.stack(b), torch.stack(q), torch.stack(G),
                             torch.stack(C))

    def scores(self, mom: _GroupMoments, ridge: float) -> np.ndarray:
        """[subset] the linearity score of each subset's own normalised fit (NaN where it cannot be fitted)."""
        out = np.full(len(self.members), np.nan)
        for k, groups in enumerate(self.members):
            n = int(mom.n[groups].sum())
            d = mom.G.shape[1]
            if n < 2 or (ridge == 0 and n - 1 <= d):
                continue
            sel = torch.from_numpy(groups).to(mom.G.device)
            a, b = mom.a[sel].sum(0), mom.b[sel].sum(0)
            G = mom.G[sel].sum(0) - torch.outer(a, a) / n
            C = mom.C[sel].sum(0) - torch.outer(a, b) / n
            xx, yy = float(torch.trace(G)), float(mom.q[sel].sum()) - float(b @ b) / n
            if not (xx > 0 and yy > 0):
                continue
            G, C = G / xx, C / (xx * yy) ** 0.5
            with lapack_threads(G.device):
                lam, V = torch.linalg.eigh(G)
            if ridge > 0:
                w = 1.0 / (lam.clamp(min=0) + ridge)
            else:
                tol = max(n, d) * torch.finfo(G.dtype).eps * float(lam.max().clamp(min=0))
                w = torch.where(lam > tol, 1.0 / lam.clamp(min=tol), torch.zeros_like(lam))
            M = V.T @ C
            out[k] = float(((2.0 * w - w * w * lam.clamp(min=0)) * (M * M).sum(dim=1)).sum())
        return out


def _owned(T: torch.Tensor, M: Any) -> torch.Tensor:
    """``T`` (converted from ``M``), or a copy of it when it still shares ``M``'s memory."""
    if isinstance(M, torch.Tensor):
        shared = T.untyped_storage().data_ptr() == M.untyped_storage().data_ptr()
    elif isinstance(M, np.ndarray):
        shared = T.device.type == "cpu" and np.shares_memory(T.numpy(), M)
    else:
        shared = False
    return T.clone() if shared else T


class _ProfileLayer:
    """One layer of a profile, converted to float64, checked and normalised once, in one float64
    buffer (the states themselves are not kept): ``normalised`` (X̃), ``norm`` the Frobenius norm of
    the centred states."""

    def __init__(self, M: Any, name: str, device, ridge: float, rows: int | None = None):
        T = as_matrix(M, name, device=device, dtype=torch.float64, min_rows=2)
        n, d = T.shape
        if rows is not None and n != rows:
            raise ValueError(f"X and Y must hold the same tokens (rows); got {rows} and {n}")
        if not bool(torch.isfinite(T.sum())):  # one reduction; the row scan only when it fails
            check_finite_rows(T, name)
        if ridge == 0 and n - 1 <= d:
            raise ValueError(
                f"a least-squares map needs more tokens than dimensions (n_tokens - 1 > d) to be "
                f"non-trivial; got n_tokens={n}, d={d}. Use more tokens or ridge > 0."
            )
        T = _owned(T, M)  # the caller's own float64 states are centred in a copy, never in place
        _, self.norm = _centred(T, inplace=True)
        self.normalised = T.div_(self.norm)

    def centred_rows(self, start: int, stop: int | None) -> torch.Tensor:
        """Rows ``start:stop`` of the centred states (a new tensor)."""
        return self.normalised[start:stop] * self.norm


@dataclass(frozen=True)
class GroupMeans:
    """Mean of a per-token value within groups.

    keys : [group] the group key (token id, token string or class name).
    mean : [group] or [row, group] when the values had a leading axis (e.g. layer pairs).
    count : [group] tokens per group.
    """

    keys: np.ndarray
    mean: np.ndarray
    count: np.ndarray


def group_means(values: Any, groups: Any, order: Sequence | None = None) -> GroupMeans:
    """Mean of a value whose last axis is ``token`` within each group label (e.g. a token class);
    keys sorted, or in ``order`` (only the groups present) when given."""
    V = np.asarray(to_numpy(values), dtype=np.float64)
    groups = np.asarray(groups)
    if V.shape[-1] != groups.shape[0]:
        raise ValueError(f"values have {V.shape[-1]} tokens on the last axis but {groups.shape[0]} group labels came")
    keys, inverse = np.unique(groups, return_inverse=True)
    if order is not None:
        keys = np.array([k for k in order if k in set(keys.tolist())])
        pos = {k: i for i, k in enumerate(keys.tolist())}
        inverse = np.array([pos[g] for g in groups.tolist()], dtype=np.int64)
    count = np.bincount(inverse, minlength=len(keys))
    V2 = V.reshape(-1, V.shape[-1])
    sums = np.stack([np.bincount(inverse, weights=row, minlength=len(keys)) for row in V2])
    mean = (sums / count).reshape(V.shape[:-1] + (len(keys),))
    return GroupMeans(keys=keys, mean=mean, count=count)


def aggregate_by_token(values: Any, tokens: Any, *, min_count: int = 1) -> GroupMeans:
    """Mean per token type (id or string) of a value whose last axis is ``token``."""
    g = group_means(values, np.asarray(tokens))
    keep = g.count >= min_count
    return GroupMeans(keys=g.keys[keep], mean=g.mean[..., keep], count=g.count[keep])
