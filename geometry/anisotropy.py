"""Anisotropy of contextual token states (Ethayarajh 2019, "How contextual are contextualized word
representations?"), raw and baseline-adjusted.

Definitions (X is ``(token, d_model)``; cos is cosine similarity)
-----------------------------------------------------------------
- ``mean_cosine``: the anisotropy baseline, mean cos over *all* distinct token pairs (closed form,
  see :mod:`geometry.outliers`); ≈ 0 for an isotropic distribution centred at the origin.
- ``top_pc_share``: largest eigenvalue of the covariance over its trace. For i.i.d. isotropic
  Gaussian data it is not 0 but ≈ (1 + √(d/n))² / d (the Marchenko–Pastur edge), which the adjusted
  value subtracts, so the adjusted share of an isotropic cloud is ≈ 0 at any n and d.
- ``self_similarity`` (Ethayarajh §3.3): for a word type w with occurrences in several contexts,
  the mean cos between its occurrences; averaged over word types with ≥ ``min_count`` occurrences.
  Adjusted: minus ``mean_cosine``, which is exactly the expected value of the same statistic over
  random groups of tokens.
- ``intra_sentence_similarity``: per context (sentence/window), the mean cos between each token and
  the context's mean vector; averaged over contexts. Adjusted: minus the same statistic after
  shuffling the context labels across tokens (same context sizes), the matched random baseline.
- ``mev`` (maximum explainable variance): for a word type, σ₁² / Σσ² of its (uncentred)
  occurrence matrix, as the paper defines it (§3.3); averaged over word types. Adjusted: minus the
  same with word labels shuffled.
- ``mev_centred``: the same of the centred occurrence matrix (each type's mean occurrence
  subtracted: a PCA), as the paper's own code (kawine/contextual) computes it. The two differ
  widely on real states (0.40–0.57 centred against 0.73–0.996 uncentred on one checkpoint): the
  uncentred value includes the shared mean direction that anisotropy puts in every occurrence.
  A type seen exactly twice has a centred MEV of 1 by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ._mev import mev_groups
from .arrays import as_matrix, check_finite_rows, lapack_threads, to_numpy
from .moments import layer_anisotropy, layers_anisotropy, stats_anisotropy
from .outliers import _unit_rows

__all__ = [
    "mean_cosine", "top_pc_share", "self_similarity", "intra_sentence_similarity", "mev",
    "Anisotropy", "anisotropy", "AnisotropyProfile", "anisotropy_by_layer", "anisotropy_profiles",
    "anisotropy_from_stats",
]  # fmt: skip


def _load(X: Any) -> torch.Tensor:
    T = as_matrix(X, "X", dtype=torch.float64, min_rows=2)
    check_finite_rows(T, "X")
    return T


def _labels(labels: Any, n: int, name: str) -> torch.Tensor:
    arr = np.asarray(to_numpy(labels))
    if arr.shape != (n,):
        raise ValueError(f"{name} must have one label per token, shape ({n},); got shape {arr.shape}")
    _, inv = np.unique(arr, return_inverse=True)
    return torch.as_tensor(inv.reshape(-1), dtype=torch.long)


def mean_cosine(X: Any) -> float:
    """Mean cosine similarity over all distinct pairs of rows."""
    U = _unit_rows(_load(X))
    n = U.shape[0]
    s = U.sum(dim=0)
    return float(((s @ s) - n) / (n * (n - 1)))


def top_pc_share(X: Any, adjusted: bool = False) -> float:
    """Share of the total variance on the first principal component (optionally minus the
    isotropic-Gaussian expectation (1 + √(d/n))² / d)."""
    T = _load(X)
    Xc = T - T.mean(dim=0, keepdim=True)
    n, d = Xc.shape
    with lapack_threads(Xc.device):
        # eigenvalues of the smaller Gram matrix: same non-zero spectrum as the covariance
        ev = torch.linalg.eigvalsh(Xc.T @ Xc if n >= d else Xc @ Xc.T).clamp(min=0)
    share = float(ev[-1] / ev.sum())
    if adjusted:
        share -= (1.0 + np.sqrt(d / (n - 1))) ** 2 / d
    return share


def _group_sums(U: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    G = int(g.max()) + 1
    S = torch.zeros((G, U.shape[1]), dtype=U.dtype).index_add_(0, g, U)
    return S, torch.bincount(g, minlength=G).to(U.dtype)


def self_similarity(X: Any, words: Any, min_count: int = 2) -> float:
    """Mean over word types (≥ ``min_count`` occurrences) of the mean pairwise cos of their occurrences."""
    U = _unit_rows(_load(X)).cpu()
    g = _labels(words, U.shape[0], "words")
    S, m = _group_sums(U, g)
    keep = m >= max(2, min_count)
    if not bool(keep.any()):
        return float("nan")
    sims = ((S * S).sum(dim=1)[keep] - m[keep]) / (m[keep] * (m[keep] - 1))
    return float(sims.mean())


def intra_sentence_similarity(X: Any, sentences: Any) -> float:
    """Mean over contexts of the mean cos between each token and its context's mean vector."""
    T = _load(X).cpu()
    g = _labels(sentences, T.shape[0], "sentences")
    S, m = _group_sums(T, g)
    centroid = S / m.unsqueeze(1)
    cos = (_unit_rows(T) * centroid[g]).sum(dim=1) / torch.linalg.vector_norm(centroid[g], dim=1).clamp_min(1e-300)
    per_ctx = torch.zeros(len(m), dtype=T.dtype).index_add_(0, g, cos) / m
    keep = m >= 2
    return float(per_ctx[keep].mean()) if bool(keep.any()) else float("nan")


def mev(X: Any, words: Any, min_count: int = 2, max_words: int | None = 2000, seed: int = 0,
        centred: bool = False, max_occurrences: int | None = None) -> float:
    """Mean over word types of σ₁²/Σσ² of their occurrence matrices (Ethayarajh 2019, §3.3);
    ``centred``: of the matrices minus their mean occurrence (see the module docstring).

    At most ``max_words`` word types (a fixed random choice) are used to bound the time, and of each
    at most ``max_occurrences`` occurrences (a fixed random choice; see :func:`geometry._mev.mev_groups`).
    """
    T = _load(X).cpu()
    g = _labels(words, T.shape[0], "words")
    groups = mev_groups(g.numpy(), min_count, max_words, seed, max_occurrences)
    if not groups:
        return float("nan")
    vals = []
    with lapack_threads(T.device):
        for rows in groups:
            W = T[torch.as_tensor(rows)]
            W = W - W.mean(dim=0, keepdim=True) if centred else W
            # σ² of W are the eigenvalues of the small Gram matrix W Wᵀ (occurrences × occurrences)
            ev = torch.linalg.eigvalsh(W @ W.T if W.shape[0] <= W.shape[1] else W.T @ W).clamp(min=0)
            vals.append(float(ev[-1] / ev.sum()))
    return float(np.mean(vals))


@dataclass(frozen=True)
class Anisotropy:
    """Anisotropy measures of one layer (scalars unless noted; NaN when labels were not given).

    ``*_adjusted`` = raw minus the random baseline of the module docstring.
    cosine_contributions : [d_model] per-dimension share of ``mean_cosine`` (sums to it).
    rogue_dims : [k] top dimensions by contribution. rogue_share : share of the mean cosine they carry.
    """

    mean_cosine: float
    top_pc_share: float
    top_pc_share_adjusted: float
    self_similarity: float
    self_similarity_adjusted: float
    intra_sentence_similarity: float
    intra_sentence_similarity_adjusted: float
    mev: float
    mev_adjusted: float
    mev_centred: float
    mev_centred_adjusted: float
    rogue_share: float
    rogue_dims: np.ndarray
    cosine_contributions: np.ndarray


def anisotropy(
    X: Any,
    *,
    words: Any = None,
    sentences: Any = None,
    k_rogue: int = 3,
    min_count: int = 2,
    max_words: int | None = 2000,
    seed: int = 0,
    max_occurrences: int | None = None,
) -> Anisotropy:
    """All anisotropy measures of one ``(token, d_model)`` matrix.

    ``words``: a word-type label per token (token id or string) for self-similarity and MEV;
    ``sentences``: a context label per token for intra-sentence similarity. Computed in float32 from
    two passes over the rows (:mod:`geometry.moments`); equal to composing the functions above
    (float64) to float32 rounding.
    """
    return Anisotropy(**layer_anisotropy(X, ("raw",), words=words, sentences=sentences, k_rogue=k_rogue,
                                         min_count=min_count, max_words=max_words, seed=seed,
                                         max_occurrences=max_occurrences)["raw"])


@dataclass(frozen=True)
class AnisotropyProfile:
    """Anisotropy per layer under one post-processing.

    Every scalar field of :class:`Anisotropy` becomes a ``[layer]`` array; ``rogue_dims`` is
    ``[layer, k]`` and ``cosine_contributions`` is ``[layer, d_model]`` (d_model after
    post-processing: "remove_top" deletes columns, so indices then refer to the remaining ones).
    """

    layers: np.ndarray
    postprocessing: str
    mean_cosine: np.ndarray
    top_pc_share: np.ndarray
    top_pc_share_adjusted: np.ndarray
    self_similarity: np.ndarray
    self_similarity_adjusted: np.ndarray
    intra_sentence_similarity: np.ndarray
    intra_sentence_similarity_adjusted: np.ndarray
    mev: np.ndarray
    mev_adjusted: np.ndarray
    mev_centred: np.ndarray
    mev_centred_adjusted: np.ndarray
    rogue_share: np.ndarray
    rogue_dims: np.ndarray
    cosine_contributions: np.ndarray


def anisotropy_by_layer(
    states: Sequence[Any] | Any,
    *,
    layers: Sequence[int] | None = None,
    words: Any = None,
    sentences: Any = None,
    postprocessing: str = "raw",
    k_rogue: int = 3,
    min_count: int = 2,
    max_words: int | None = 2000,
    seed: int = 0,
    max_occurrences: int | None = None,
    progress: bool = False,
) -> AnisotropyProfile:
    """:func:`anisotropy` of every layer after :func:`geometry.postprocess.postprocess`."""
    return anisotropy_profiles(states, (postprocessing,), layers=layers, words=words, sentences=sentences,
                               k_rogue=k_rogue, min_count=min_count, max_words=max_words, seed=seed,
                               max_occurrences=max_occurrences, progress=progress)[postprocessing]


def anisotropy_profiles(
    states: Sequence[Any] | Any,
    postprocessings: Sequence[str] = ("raw",),
    *,
    layers: Sequence[int] | None = None,
    words: Any = None,
    sentences: Any = None,
    k_rogue: int = 3,
    min_count: int = 2,
    max_words: int | None = 2000,
    seed: int = 0,
    max_occurrences: int | None = None,
    progress: bool = False,
) -> dict[str, AnisotropyProfile]:
    """``{post-processing: AnisotropyProfile}``: every post-processing of every layer from one
    moments pass and one metrics pass per layer (:mod:`geometry.moments`); each profile equals
    :func:`anisotropy_by_layer` with that post-processing."""
    # a lazy sequence (lens.store.views.LayerView) stays lazy: each layer is read when it is reached
    mats = [states[i] for i in range(states.shape[0])] if hasattr(states, "ndim") else \
        (states if isinstance(states, Sequence) else list(states))
    if not mats:
        raise ValueError("anisotropy_by_layer needs at least one layer; got none")
    labels = np.arange(len(mats)) if layers is None else np.asarray(list(layers), dtype=np.int64)
    if len(labels) != len(mats):
        raise ValueError(f"got {len(labels)} layer labels for {len(mats)} state matrices")
    pps = tuple(dict.fromkeys(postprocessings))
    per = {pp: [] for pp in pps}
    runs = layers_anisotropy(mats, pps, words=words, sentences=sentences, k_rogue=k_rogue, min_count=min_count,
                             max_words=max_words, seed=seed, max_occurrences=max_occurrences)
    for res in tqdm(runs, total=len(mats), desc=f"anisotropy ({', '.join(pps)})", disable=not progress):
        for pp in pps:
            per[pp].append(res[pp])
    out = {}
    for pp in pps:
        cols = {f.name: np.stack([np.asarray(r[f.name]) for r in per[pp]]) for f in fields(Anisotropy)}
        out[pp] = AnisotropyProfile(layers=labels, postprocessing=pp, **cols)
    return out


def anisotropy_from_stats(stats: Any, k_rogue: int = 3) -> AnisotropyProfile:
    """The raw anisotropy profile of a :class:`lens.store.layer_stats.LayerStats` (sums collected without
    the states, e.g. on NDIF): mean cosine, cosine contributions, rogue dimensions and, when the
    covariance was collected, the top-PC shares — equal to :func:`anisotropy_by_layer` on the same
    tokens to float rounding. The fields that need word or context labels (self-similarity,
    intra-sentence similarity, MEV) are NaN: they are not sums over tokens."""
    per = stats_anisotropy(stats, k_rogue=k_rogue)
    cols = {f.name: np.stack([np.asarray(r[f.name]) for r in per]) for f in fields(Anisotropy)}
    return AnisotropyProfile(layers=np.asarray(stats.layers), postprocessing="raw", **cols)
