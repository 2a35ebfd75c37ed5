"""Rogue dimensions and positional outlier neurons.

Rogue dimensions (Timkey & van Schijndel 2021, "All bark and no bite")
----------------------------------------------------------------------
The cosine of two states is a sum over dimensions, cos(u, v) = Σ_i u_i v_i / (‖u‖‖v‖), so the
expected cosine of random token pairs splits into per-dimension contributions
CC_i = E[u_i v_i / (‖u‖‖v‖)] that add up to it. We take the expectation over *all* distinct pairs
of the given tokens, which has a closed form with û = u/‖u‖:
CC_i = ((Σ_t û_ti)² − Σ_t û_ti²) / (n(n − 1)). A few dimensions typically carry most of the mean
cosine; ``rogue_share`` is the fraction carried by the top-k.

Positional outlier neurons
--------------------------
Dimensions whose typical magnitude dwarfs the rest (Kovaleva et al. 2021, "BERT busters"; Puccetti
et al. 2022 use a 3σ criterion across dimensions), and which Luo et al. (2021, "Positional
artefacts propagate through masked language model embeddings") trace to position. Per layer we
record each dimension's mean |x_i|, its z-score across dimensions, how often it holds a token's
largest-magnitude coordinate, and the Pearson correlation of x_i with token position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lens.runtime.threads import serial

from .arrays import as_matrix, check_finite_rows, to_numpy

__all__ = [
    "cosine_contributions", "RogueDimensions", "rogue_dimensions", "OutlierNeurons", "outlier_neurons",
]  # fmt: skip


def _unit_rows(X: torch.Tensor) -> torch.Tensor:
    norms = torch.linalg.vector_norm(X, dim=1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError(
            f"cosine similarity is undefined for zero vectors; got {int((norms == 0).sum())} all-zero row(s)"
        )
    return X / norms


def cosine_contributions(X: Any) -> np.ndarray:
    """Per-dimension contribution to the mean cosine over all distinct token pairs, shape ``(d_model,)``.

    The entries sum to the mean cosine (see module docstring).
    """
    T = as_matrix(X, "X", dtype=torch.float64, min_rows=2)
    check_finite_rows(T, "X")
    U = _unit_rows(T)
    n = U.shape[0]
    s = U.sum(dim=0)
    return to_numpy((s * s - (U * U).sum(dim=0)) / (n * (n - 1)))


@dataclass(frozen=True)
class RogueDimensions:
    """The dimensions that carry the most of the mean cosine.

    dims : [k] indices into d_model, by decreasing contribution.
    share : [k] each one's contribution divided by the mean cosine.
    top_share : float, share of the mean cosine carried by all k together.
    contributions : [d_model] every dimension's contribution (sums to ``mean_cosine``).
    mean_cosine : float.
    """

    dims: np.ndarray
    share: np.ndarray
    top_share: float
    contributions: np.ndarray
    mean_cosine: float


def rogue_dimensions(X: Any, k: int = 3) -> RogueDimensions:
    """Top-``k`` dimensions by contribution to the mean cosine (Timkey & van Schijndel 2021).

    ``share`` is relative to the mean cosine, so it is meaningful only when the mean cosine is
    clearly above zero (for isotropic data both are noise).
    """
    cc = cosine_contributions(X)
    if not 1 <= k <= cc.shape[0]:
        raise ValueError(f"k must be between 1 and d_model={cc.shape[0]}; got {k}")
    order = np.argsort(-cc, kind="stable")[:k]
    total = float(cc.sum())
    share = cc[order] / total if total != 0 else np.full(k, np.nan)
    return RogueDimensions(
        dims=order.astype(np.int64),
        share=share,
        top_share=float(share.sum()),
        contributions=cc,
        mean_cosine=total,
    )


@dataclass(frozen=True)
class OutlierNeurons:
    """Outlier dimensions per layer and their relation to token position.

    layers : [layer] labels.
    magnitude : [layer, d_model] mean |x_i| over tokens.
    magnitude_z : [layer, d_model] z-score of ``magnitude`` across the dimensions of that layer.
    extreme_share : [layer, d_model] fraction of tokens whose largest-|x| coordinate is dimension i.
    position_corr : [layer, d_model] Pearson correlation of x_i with token position (NaN for a
        constant dimension).
    is_outlier : [layer, d_model] ``magnitude_z > z_threshold``.
    persistent_dims : [outlier] dimensions that are outliers in at least ``min_layer_fraction``
        of the layers, by decreasing number of layers.
    persistent_layer_fraction : [outlier] fraction of layers in which each is an outlier.
    persistent_position_corr : [outlier] mean |position_corr| over the layers where it is an outlier.
    """

    layers: np.ndarray
    magnitude: np.ndarray
    magnitude_z: np.ndarray
    extreme_share: np.ndarray
    position_corr: np.ndarray
    is_outlier: np.ndarray
    persistent_dims: np.ndarray
    persistent_layer_fraction: np.ndarray
    persistent_position_corr: np.ndarray


def _pearson_columns(X: torch.Tensor, p: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """Pearson correlation of each column of X with p, float64 wherever it sums, in one pass of
    chunks: each chunk widened to float64 and centred about the first rows' mean (close to the mean,
    so the sum of squares does not cancel), its sums, sums of squares and products with p − mean(p)
    accumulated (a float32 matrix-vector product over every token loses ~1e-6 of the correlation,
    more than the rounding of the rows, and moves with the thread count)."""
    n, d = X.shape
    shift = X[: min(n, 1024)].to(torch.float64).mean(dim=0)
    pc = (p - p.mean()).to(device=X.device, dtype=torch.float64)
    s1, ss, num = (torch.zeros(d, dtype=torch.float64, device=X.device) for _ in range(3))
    for s in range(0, n, chunk):
        Z = X[s : s + chunk].to(torch.float64) - shift
        s1 += Z.sum(dim=0)
        ss += (Z * Z).sum(dim=0)
        num += pc[s : s + chunk] @ Z
    num -= s1 / n * pc.sum()  # Σ pc (x − mean) = Σ pc (x − shift) − (mean − shift) Σ pc
    den = (ss - s1 * s1 / n).clamp(min=0).sqrt() * torch.linalg.vector_norm(pc)
    out = num / den
    out[den == 0] = float("nan")
    return out


def _magnitudes(X: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ_t |x_ti| in float64 per column, argmax_i |x_ti| per row)``, 4096 rows at a time (torch
    sums a column in blocks of 4096 rows, so the sums equal one reduction over all the rows, at half
    the cost of reducing the whole matrix with a cast)."""
    total = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
    arg = torch.empty(X.shape[0], dtype=torch.long, device=X.device)
    for s in range(0, X.shape[0], chunk):
        A = X[s : s + chunk].abs()
        total += A.sum(dim=0, dtype=torch.float64)
        arg[s : s + chunk] = A.argmax(dim=1)
    return total, arg


def outlier_neurons(
    states: Sequence[Any] | Any,
    positions: Any,
    *,
    layers: Sequence[int] | None = None,
    z_threshold: float = 3.0,
    min_layer_fraction: float = 0.5,
) -> OutlierNeurons:
    """Find the dimensions holding extreme values across layers and correlate them with position.

    ``states``: a sequence of ``(token, d_model)`` matrices (or a ``(layer, token, d_model)`` array);
    ``positions``: ``(token,)`` position of each token in its context window.
    """
    # a lazy sequence (lens.store.views.LayerView) stays lazy: each layer is read when it is reached
    mats = [states[i] for i in range(states.shape[0])] if hasattr(states, "ndim") else \
        (states if isinstance(states, Sequence) else list(states))
    if not mats:
        raise ValueError("outlier_neurons needs at least one layer; got none")
    labels = np.arange(len(mats)) if layers is None else np.asarray(list(layers), dtype=np.int64)
    if len(labels) != len(mats):
        raise ValueError(f"got {len(labels)} layer labels for {len(mats)} state matrices")
    pos = torch.as_tensor(np.asarray(to_numpy(positions), dtype=np.float64))
    if pos.ndim != 1:
        raise ValueError(f"positions must be 1-D (token,); got shape {tuple(pos.shape)}")
    mags, zs, ext, corr = [], [], [], []
    for lab, M in zip(labels, mats):
        # float32 rows, float64 only in the sums (no float64 copy of the layer)
        X = as_matrix(M, f"states[{lab}]", dtype=torch.float32).cpu()
        with serial(X.device):  # a few passes over one layer: a second thread waits more than it helps
            check_finite_rows(X, f"states[{lab}]")
            if X.shape[0] != pos.shape[0]:
                raise ValueError(f"positions has {pos.shape[0]} entries but layer {lab} has {X.shape[0]} tokens")
            total, arg = _magnitudes(X)
            mag = total / X.shape[0]
            sd = mag.std()
            zs.append(((mag - mag.mean()) / sd if sd > 0 else torch.zeros_like(mag)).numpy())
            mags.append(mag.numpy())
            ext.append((torch.bincount(arg, minlength=X.shape[1]).double() / X.shape[0]).numpy())
            corr.append(_pearson_columns(X, pos).numpy())
    magnitude_z = np.stack(zs)
    is_out = magnitude_z > z_threshold
    position_corr = np.stack(corr)
    frac = is_out.mean(axis=0)
    persistent = np.nonzero(frac >= min_layer_fraction)[0]
    persistent = persistent[np.argsort(-frac[persistent], kind="stable")]
    abs_corr = np.where(is_out, np.abs(position_corr), np.nan)
    with np.errstate(invalid="ignore"):
        pcorr = np.array([np.nanmean(abs_corr[:, d]) for d in persistent]) if len(persistent) else np.zeros(0)
    return OutlierNeurons(
        layers=labels,
        magnitude=np.stack(mags),
        magnitude_z=magnitude_z,
        extreme_share=np.stack(ext),
        position_corr=position_corr,
        is_outlier=is_out,
        persistent_dims=persistent.astype(np.int64),
        persistent_layer_fraction=frac[persistent],
        persistent_position_corr=pcorr,
    )
