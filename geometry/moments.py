"""Every anisotropy measure of one layer, under every post-processing, from two passes over its rows.

:mod:`geometry.anisotropy` defines the measures (and keeps a plain float64 function for each, the
reference the tests hold this module to); :mod:`geometry.postprocess` defines the
post-processings. Recomputing each measure on a float64 post-processed copy costs a copy, a
centring, a d × d Gram matrix and a few unit-row passes per measure and per post-processing. Here:

1. **Moments pass** (float32 chunks of rows): the mean and the covariance (chunk Gram matrices in
   float32 about a shift close to the mean, accumulated in float64 — centring first is what keeps
   the variance from cancelling against a large mean), and the unit-row sums that rank the rogue
   dimensions. From these, every post-processing's parameters follow, and so does the top-PC share
   of each linear post-processing without touching the rows again (:mod:`geometry._transforms`).
   The same unit rows give every raw measure in this pass (below), so "raw" needs no second one.
2. **Metrics pass** (float32 chunks), for the other post-processings: each chunk is post-processed
   in every way at once; unit rows give the per-dimension sums behind the mean cosine and its
   per-dimension contributions, and group sums (float64) by word and by context give
   self-similarity and intra-sentence similarity (a context's mean cosine to its centroid is
   ``U_g · c_g / (m_g ‖c_g‖)`` from the group sums ``U_g`` of unit rows and ``c_g`` of rows) and
   their shuffled-label baselines; clipping, the one non-linear post-processing, accumulates its
   covariance here. The context sums of the rows themselves are taken once, of the raw rows in the
   moments pass: each affine post-processing's follow from them (``(S − m μ) A``). The rows the
   MEV sample reads are kept as they pass (no second transform). Sums run a few hundred rows at a
   time, so that a chunk's unit rows and their float64 copy stay in cache.

MEV (:mod:`geometry._mev`) reads the few hundred sampled words' rows, one batched Gram matrix and
one batched ``eigvalsh`` per group size for the measure and its baseline together. The labels,
their shuffled baselines and the MEV sample are prepared once per run, not per layer
(:class:`geometry._groups.Groups`). Random draws match :func:`geometry.anisotropy.anisotropy`
exactly (same permutations, same word sample), so the results equal it to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from lens.store.layer_stats import cosine_contributions, cov_from_sums, mean_from_sums
from lens.runtime.threads import serial

from ._groups import Groups
from ._mev import mev_pair
from ._transforms import Transforms, top_share
from .arrays import as_matrix, check_finite_rows

__all__ = ["layer_anisotropy", "layers_anisotropy", "stats_anisotropy"]

_CHUNK = 4096  # rows per float32 Gram matrix (moments, clip covariance)
_SUB = 512  # rows per unit-row / group-sum step
_F64 = torch.float64


def _unit(Y: torch.Tensor) -> torch.Tensor:
    norms = torch.linalg.vector_norm(Y, dim=1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError(
            f"cosine similarity is undefined for zero vectors; got {int((norms == 0).sum())} all-zero row(s)")
    return Y / norms


class _Sums:
    """One post-processing's sums over the rows, float64: unit rows per dimension and (``units``)
    per group of every label in ``lab``, and (``rows``) the rows themselves per context group."""

    def __init__(self, lab: dict | None, d: int, device, *, units: bool = True, rows: bool = True):
        z = lambda *shape: torch.zeros(shape, dtype=_F64, device=device)  # noqa: E731
        self.su, self.su2 = z(d), z(d)
        self.L = lab["L"] if lab else {}
        self.U = {k: z(lab["G"][k], d) for k in self.L} if units else {}
        self.Y = {k: z(lab["G"][k], d) for k in self.L if k in ("s", "sp")} if rows else {}

    def add(self, Y: torch.Tensor, start: int) -> None:
        """Add the rows ``Y`` (rows ``start`` on of the layer), a few hundred at a time: the unit
        rows, their float64 copy and the rows' float64 copy then stay in cache for every sum."""
        for a in range(0, Y.shape[0], _SUB):
            Ys = Y[a : a + _SUB]
            rows = slice(start + a, start + a + Ys.shape[0])
            U = _unit(Ys)
            U64 = U.to(_F64) if self.U else None  # its column sums equal U.sum(dtype=float64), in half the time
            self.su += U.sum(dim=0, dtype=_F64) if U64 is None else U64.sum(dim=0)
            self.su2 += (U * U).sum(dim=0, dtype=_F64)
            if U64 is not None:
                for k, acc in self.U.items():
                    acc.index_add_(0, self.L[k][rows], U64)
            if self.Y:
                Y64 = Ys.to(_F64)
                for k, acc in self.Y.items():
                    acc.index_add_(0, self.L[k][rows], Y64)


class _Moments:
    """Mean, covariance and raw unit-row sums of X, in one pass of float32 chunks (``sums``: the raw
    :class:`_Sums` to fill in the same pass; by default only the per-dimension unit-row sums)."""

    def __init__(self, X: torch.Tensor, sums: "_Sums | None" = None):
        n, d = X.shape
        dev = X.device
        self.shift = X[: min(n, 1024)].to(_F64).mean(dim=0)
        s32 = self.shift.to(torch.float32)
        S1 = torch.zeros(d, dtype=_F64, device=dev)
        S2 = torch.zeros((d, d), dtype=_F64, device=dev)
        self.sums = _Sums(None, d, dev) if sums is None else sums
        for s in range(0, n, _CHUNK):
            C = X[s : s + _CHUNK]
            Z = C - s32
            S1 += Z.sum(dim=0, dtype=_F64)
            S2 += (Z.T @ Z).to(_F64)
            self.sums.add(C, s)
        self._finish(n, S1, S2, self.sums.su, self.sums.su2)

    def _finish(self, n, S1, S2, su, su2) -> None:
        self.n, self.d = n, S1.shape[0]
        self.mean = mean_from_sums(n, self.shift, S1)
        self.cov = None if S2 is None else cov_from_sums(n, S1, S2)
        self.cc = cosine_contributions(n, su, su2)  # raw cosine contributions (geometry.outliers)

    @classmethod
    def from_sums(cls, n: int, shift, S1, S2, su, su2) -> "_Moments":
        """The same moments from sums taken elsewhere (:class:`lens.store.layer_stats.LayerStats`, e.g. on NDIF)."""
        mom = cls.__new__(cls)
        f64 = lambda a: None if a is None else torch.as_tensor(a, dtype=_F64)  # noqa: E731
        mom.shift = f64(shift)
        mom._finish(int(n), f64(S1), f64(S2), f64(su), f64(su2))
        return mom


def _rogue(cc: np.ndarray, k: int) -> tuple[np.ndarray, float, float]:
    order = np.argsort(-cc, kind="stable")[:k]
    total = float(cc.sum())
    share = cc[order] / total if total != 0 else np.full(k, np.nan)
    return order.astype(np.int64), float(share.sum()), total


def _label_free(n: int, cc: torch.Tensor, cov: torch.Tensor | None, k_rogue: int,
                spectrum: torch.Tensor | None = None) -> dict:
    """Every Anisotropy field that needs no labels, from the cosine contributions and the covariance
    or its eigenvalues ``spectrum`` (neither: top-PC shares NaN); the labelled fields are NaN."""
    cc = cc.cpu().numpy()
    d = cc.shape[0]
    dims, rogue_share, mc = _rogue(cc, min(k_rogue, d))
    nan = float("nan")
    share = nan if cov is None and spectrum is None else top_share(cov, spectrum)
    return dict(mean_cosine=mc, top_pc_share=share,
                top_pc_share_adjusted=share - (1.0 + np.sqrt(d / (n - 1))) ** 2 / d,
                self_similarity=nan, self_similarity_adjusted=nan, intra_sentence_similarity=nan,
                intra_sentence_similarity_adjusted=nan, mev=nan, mev_adjusted=nan, mev_centred=nan,
                mev_centred_adjusted=nan, rogue_share=rogue_share,
                rogue_dims=dims, cosine_contributions=cc)


def stats_anisotropy(stats, k_rogue: int = 3) -> list[dict]:
    """For each layer of a :class:`lens.store.layer_stats.LayerStats`, the label-free Anisotropy fields
    (mean cosine, cosine contributions, rogue dimensions, top-PC shares) by the same arithmetic as
    :func:`layer_anisotropy` on the rows themselves."""
    stats.cosine_contributions  # noqa: B018 - refuses too few tokens or all-zero rows, in the stats' words
    out = []
    for i in range(len(stats.layers)):
        mom = _Moments.from_sums(stats.n, stats.shift[i], stats.s1[i], None if stats.s2 is None else stats.s2[i],
                                 stats.su[i], stats.su2[i])
        with serial(torch.device("cpu")):
            out.append(_label_free(mom.n, mom.cc, mom.cov, k_rogue))
    return out


def layer_anisotropy(X: Any, postprocessings: tuple = ("raw",), *, words: Any = None, sentences: Any = None,
                     k_rogue: int = 3, min_count: int = 2, max_words: int | None = 2000,
                     seed: int = 0, max_occurrences: int | None = None) -> dict:
    """``{post-processing: dict of every Anisotropy field}`` for one ``(token, d_model)`` matrix
    (see :func:`geometry.anisotropy.anisotropy` for the fields and the labels).

    Runs on one thread (:func:`lens.runtime.threads.serial`): its ops are many and of d_model-sized
    matrices or row chunks, for which a busy machine's barrier waits cost more than a second thread
    gains."""
    return next(layers_anisotropy([X], postprocessings, words=words, sentences=sentences, k_rogue=k_rogue,
                                  min_count=min_count, max_words=max_words, seed=seed,
                                  max_occurrences=max_occurrences))


def layers_anisotropy(mats: Sequence[Any], postprocessings: tuple = ("raw",), *, words: Any = None,
                      sentences: Any = None, k_rogue: int = 3, min_count: int = 2, max_words: int | None = 2000,
                      seed: int = 0, max_occurrences: int | None = None) -> Iterator[dict]:
    """:func:`layer_anisotropy` of each matrix in turn (a generator), the labels, their shuffled
    baselines and the MEV sample prepared once for all the layers with as many rows as the first."""
    groups = None
    for X in mats:
        T = as_matrix(X, "X", dtype=torch.float32, min_rows=2).contiguous()
        with serial(T.device):
            check_finite_rows(T, "X")
            if groups is None or groups.n != T.shape[0]:
                groups = Groups(T.shape[0], words, sentences, min_count=min_count, max_words=max_words, seed=seed,
                                max_occurrences=max_occurrences)
            res = _layer(T, tuple(postprocessings), groups, k_rogue)
        yield res  # outside serial(): the caller's code between layers keeps its threads


def _layer(T: torch.Tensor, pps: tuple, groups: Groups, k_rogue: int) -> dict:
    n, d = T.shape
    dev = T.device
    lab = groups.on(dev) if groups.codes else None
    mev = groups.mev
    # the raw rows' context sums serve every affine post-processing (Transforms.sums), so pass 1 takes
    # them even without "raw"; its unit-row group sums only for "raw"
    raw = _Sums(lab, d, dev, units="raw" in pps)
    mom = _Moments(T, raw)
    tf = Transforms(T, mom, pps, k_rogue)
    sums = {"raw": raw}
    rest = [pp for pp in tf.fns if pp != "raw"]
    kept = {}  # post-processing -> the MEV sample's rows, post-processed, in layout order
    clip = {}  # post-processing -> (shift, S1, S2) of the clipped rows
    if rest:
        slots = mev.chunk_slots(n, _CHUNK, dev) if mev is not None else None
        for i, s0 in enumerate(range(0, n, _CHUNK)):
            C = T[s0 : s0 + _CHUNK]
            for pp in rest:
                fn = tf.fns[pp]
                Y = fn(C)
                if pp not in sums:
                    sums[pp] = _Sums(lab, Y.shape[1], dev, rows=pp not in tf.sums)
                sums[pp].add(Y, s0)
                if slots is not None:
                    if pp not in kept:
                        kept[pp] = torch.empty((len(mev.rows), Y.shape[1]), dtype=Y.dtype, device=dev)
                    kept[pp][slots[i][0]] = Y[slots[i][1]]
                if pp not in tf.sums:  # not affine (clip): its covariance about the clipped shift
                    if pp not in clip:
                        z = torch.zeros(Y.shape[1], dtype=_F64, device=dev)
                        clip[pp] = (fn(mom.shift.to(torch.float32).unsqueeze(0))[0], z,
                                    torch.zeros((Y.shape[1], Y.shape[1]), dtype=_F64, device=dev))
                    shift, S1, S2 = clip[pp]
                    Z = Y - shift
                    S1 += Z.sum(dim=0, dtype=_F64)
                    S2 += (Z.T @ Z).to(_F64)
    for pp in rest:
        if pp in tf.sums:  # affine: its context sums from the raw ones (no float64 copy and sums per pass)
            sums[pp].Y = {k: tf.sums[pp](S, lab["m"][k]) for k, S in raw.Y.items()}
    if mev is not None and "raw" in tf.fns:
        kept["raw"] = T[torch.as_tensor(mev.rows, device=dev)]
    return {pp: _measures(n, sums[pp], tf, pp, clip.get(pp), lab, groups, kept.get(pp), k_rogue) for pp in tf.fns}


def _measures(n, sm: _Sums, tf: Transforms, pp: str, clip, lab, groups: Groups, kept, k_rogue: int) -> dict:
    """Every Anisotropy field of one post-processing from its sums (and its MEV rows ``kept``)."""
    cov = tf.cov[pp] if clip is None else cov_from_sums(n, clip[1], clip[2])
    r = _label_free(n, cosine_contributions(n, sm.su, sm.su2), cov, k_rogue, tf.spectrum.get(pp))
    mc = r["mean_cosine"]
    if groups.has_words:
        m, keep = lab["m"]["w"], lab["keep"]["w"]
        if bool(keep.any()):
            S = sm.U["w"]
            ss = float((((S * S).sum(dim=1)[keep] - m[keep]) / (m[keep] * (m[keep] - 1))).mean())
            r["self_similarity"], r["self_similarity_adjusted"] = ss, ss - mc
        if kept is not None:
            v, v_perm = mev_pair(kept, groups.mev)
            r["mev"], r["mev_adjusted"] = v, v - v_perm
            v, v_perm = mev_pair(kept, groups.mev, centred=True)
            r["mev_centred"], r["mev_centred_adjusted"] = v, v - v_perm
    if groups.has_sentences:
        isim = []
        for name in ("s", "sp"):
            m, keep = lab["m"][name], lab["keep"][name]
            cent = sm.Y[name] / m.unsqueeze(1)
            per = (sm.U[name] * cent).sum(dim=1) / torch.linalg.vector_norm(cent, dim=1).clamp_min(1e-300) / m
            isim.append(float(per[keep].mean()) if bool(keep.any()) else float("nan"))
        r["intra_sentence_similarity"] = isim[0]
        r["intra_sentence_similarity_adjusted"] = isim[0] - isim[1]
    return r
