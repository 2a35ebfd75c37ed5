"""Every anisotropy measure of one layer, under every post-processing, from two passes over its rows.

:mod:`geometry.anisotropy` defines the measures (and keeps a plain float64 function for each, the
reference the tests hold this module to); :mod:`geometry.postprocess` defines the
post-processings. Recomputing each measure on a float64 post-processed copy costs a copy, a
centring, a d × d Gram matrix and a few unit-row passes per measure and per post-processing. Here:

1. **Moments pass** (float32 chunks of rows): the mean and the covariance (chunk Gram matrices in
   float32 about a shift close to the mean, accumulated in float64 — centring first is what keeps
   the variance from cancelling against a large mean), and the raw unit-row sums that rank the
   rogue dimensions. From these, every post-processing's parameters follow (standardise: the
   standard deviations; ZCA whitening: one ``eigh`` of the covariance; remove-top: the rogue
   dimensions; clip: the median and MAD of a strided sample, as :func:`geometry.clip_outliers`),
   and so does the top-PC share of each linear post-processing without touching the rows again
   (standardised: the correlation matrix; whitened: eigenvalues λ/(λ + floor); removed: a
   sub-matrix).
2. **Metrics pass** (float32 chunks): each chunk is post-processed in every way at once; unit rows
   give the per-dimension sums behind the mean cosine and its per-dimension contributions, and
   group sums (float64) by word and by context give self-similarity and intra-sentence similarity
   (a context's mean cosine to its centroid is ``U_g · c_g / (m_g ‖c_g‖)`` from the group sums
   ``U_g`` of unit rows and ``c_g`` of rows) and their shuffled-label baselines; clipping, the one
   non-linear post-processing, accumulates its covariance here.

MEV reads the few hundred sampled words' own rows (a gather), with batched eigenvalue calls of the
small Gram matrices. Random draws match :func:`geometry.anisotropy.anisotropy` exactly (same
permutations, same word sample), so the results equal it to float32 rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lens.layer_stats import cosine_contributions, cov_from_sums, mean_from_sums
from lens.threads import serial

from .arrays import as_matrix, check_finite_rows, to_numpy

__all__ = ["layer_anisotropy", "stats_anisotropy"]

_CHUNK = 4096


def _codes(labels: Any, n: int, name: str) -> np.ndarray:
    arr = np.asarray(to_numpy(labels))
    if arr.shape != (n,):
        raise ValueError(f"{name} must have one label per token, shape ({n},); got shape {arr.shape}")
    return np.unique(arr, return_inverse=True)[1].reshape(-1)


def _unit(Y: torch.Tensor) -> torch.Tensor:
    norms = torch.linalg.vector_norm(Y, dim=1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError(
            f"cosine similarity is undefined for zero vectors; got {int((norms == 0).sum())} all-zero row(s)")
    return Y / norms


def _top_share(cov: torch.Tensor) -> float:
    with serial(cov.device):
        ev = torch.linalg.eigvalsh(cov).clamp(min=0)
    return float(ev[-1] / ev.sum())


class _Moments:
    """Mean, covariance and raw unit-row sums of X, in one pass of float32 chunks."""

    def __init__(self, X: torch.Tensor):
        n, d = X.shape
        dev = X.device
        self.shift = X[: min(n, 1024)].to(torch.float64).mean(dim=0)
        s32 = self.shift.to(torch.float32)
        S1 = torch.zeros(d, dtype=torch.float64, device=dev)
        S2 = torch.zeros((d, d), dtype=torch.float64, device=dev)
        su = torch.zeros(d, dtype=torch.float64, device=dev)
        su2 = torch.zeros(d, dtype=torch.float64, device=dev)
        for s in range(0, n, _CHUNK):
            C = X[s : s + _CHUNK]
            Z = C - s32
            S1 += Z.sum(dim=0, dtype=torch.float64)
            S2 += (Z.T @ Z).to(torch.float64)
            U = _unit(C)
            su += U.sum(dim=0, dtype=torch.float64)
            su2 += (U * U).sum(dim=0, dtype=torch.float64)
        self._finish(n, S1, S2, su, su2)

    def _finish(self, n, S1, S2, su, su2) -> None:
        self.n, self.d = n, S1.shape[0]
        self.mean = mean_from_sums(n, self.shift, S1)
        self.cov = None if S2 is None else cov_from_sums(n, S1, S2)
        self.cc = cosine_contributions(n, su, su2)  # raw cosine contributions (geometry.outliers)

    @classmethod
    def from_sums(cls, n: int, shift, S1, S2, su, su2) -> "_Moments":
        """The same moments from sums taken elsewhere (:class:`lens.layer_stats.LayerStats`, e.g. on NDIF)."""
        mom = cls.__new__(cls)
        f64 = lambda a: None if a is None else torch.as_tensor(a, dtype=torch.float64)  # noqa: E731
        mom.shift = f64(shift)
        mom._finish(int(n), f64(S1), f64(S2), f64(su), f64(su2))
        return mom


def _rogue(cc: np.ndarray, k: int) -> tuple[np.ndarray, float, float]:
    order = np.argsort(-cc, kind="stable")[:k]
    total = float(cc.sum())
    share = cc[order] / total if total != 0 else np.full(k, np.nan)
    return order.astype(np.int64), float(share.sum()), total


class _Transforms:
    """Each post-processing as a chunk → chunk function, with its fitted parameters (float32)."""

    def __init__(self, X: torch.Tensor, mom: _Moments, pps: tuple, k: int, n_sigma: float = 6.0,
                 eps_whiten: float = 1e-6):
        self.fns, self.cov = {}, {}
        dev = X.device
        for pp in pps:
            if pp == "raw":
                self.fns[pp] = lambda C: C
                self.cov[pp] = mom.cov
            elif pp == "standardize":
                sd = mom.cov.diagonal().clamp(min=0).sqrt()
                sd = torch.where(sd > 1e-12, sd, torch.ones_like(sd))
                mu32, sd32 = mom.mean.to(torch.float32), sd.to(torch.float32)
                self.fns[pp] = lambda C, mu32=mu32, sd32=sd32: (C - mu32) / sd32
                self.cov[pp] = mom.cov / torch.outer(sd, sd)
            elif pp == "whiten":
                with serial(dev):
                    evals, evecs = torch.linalg.eigh(mom.cov)
                lam = evals.clamp(min=0)
                floor = max(eps_whiten * float(lam.mean()), 1e-300)
                W = ((evecs * (1.0 / torch.sqrt(lam + floor))) @ evecs.T).to(torch.float32)
                mu32 = mom.mean.to(torch.float32)
                self.fns[pp] = lambda C, mu32=mu32, W=W: (C - mu32) @ W
                # W C W = V diag(λ / (λ⁺ + floor)) Vᵀ: its spectrum without another eigh
                self.cov[pp] = torch.diag(evals / (lam + floor))
            elif pp == "remove_top":
                if not 0 <= k < mom.d:
                    raise ValueError(f"k must be between 0 and d_model - 1 = {mom.d - 1}; got {k}")
                top = np.argsort(-mom.cc.cpu().numpy(), kind="stable")[:k]
                keep = torch.ones(mom.d, dtype=torch.bool, device=dev)
                keep[torch.as_tensor(top, dtype=torch.long, device=dev)] = False
                self.fns[pp] = lambda C, keep=keep: C[:, keep]
                self.cov[pp] = mom.cov[keep][:, keep]
            elif pp == "clip":
                flat = X.flatten()
                if flat.numel() > 4_000_000:  # a strided sample is plenty for two quantiles
                    flat = flat[:: flat.numel() // 4_000_000 + 1]
                flat = flat.to(torch.float64)
                med = flat.median()
                mad = (flat - med).abs().median() * 1.4826
                if float(mad) == 0.0:
                    self.fns[pp] = lambda C: C
                    self.cov[pp] = mom.cov
                else:
                    lo, hi = float(med - n_sigma * mad), float(med + n_sigma * mad)
                    self.fns[pp] = lambda C, lo=lo, hi=hi: C.clamp(min=lo, max=hi)
                    self.cov[pp] = None  # non-linear: accumulated in the metrics pass
            else:
                from .postprocess import POSTPROCESSING

                raise ValueError(f"unknown post-processing {pp!r}; expected one of {POSTPROCESSING}")


def _label_free(n: int, cc: torch.Tensor, cov: torch.Tensor | None, k_rogue: int) -> dict:
    """Every Anisotropy field that needs no labels, from the cosine contributions and the covariance
    (None: top-PC shares NaN); the labelled fields are NaN."""
    cc = cc.cpu().numpy()
    d = cc.shape[0]
    dims, rogue_share, mc = _rogue(cc, min(k_rogue, d))
    nan = float("nan")
    share = nan if cov is None else _top_share(cov)
    return dict(mean_cosine=mc, top_pc_share=share,
                top_pc_share_adjusted=share - (1.0 + np.sqrt(d / (n - 1))) ** 2 / d,
                self_similarity=nan, self_similarity_adjusted=nan, intra_sentence_similarity=nan,
                intra_sentence_similarity_adjusted=nan, mev=nan, mev_adjusted=nan, rogue_share=rogue_share,
                rogue_dims=dims, cosine_contributions=cc)


def stats_anisotropy(stats, k_rogue: int = 3) -> list[dict]:
    """For each layer of a :class:`lens.layer_stats.LayerStats`, the label-free Anisotropy fields
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


def _mev_rows(codes: np.ndarray, min_count: int, max_words: int | None, seed: int) -> list[np.ndarray]:
    """The row indices of each sampled word type, as :func:`geometry.anisotropy.mev` samples them."""
    counts = np.bincount(codes)
    types = np.nonzero(counts >= max(2, min_count))[0]
    if len(types) == 0:
        return []
    if max_words is not None and len(types) > max_words:
        types = np.random.default_rng(seed).choice(types, size=max_words, replace=False)
    order = np.argsort(codes, kind="stable")
    starts = np.cumsum(counts) - counts
    return [order[starts[w] : starts[w] + counts[w]] for w in types]


def _mev(Y: torch.Tensor, groups: list[np.ndarray]) -> float:
    """Mean σ₁²/Σσ² over the groups' rows of Y (rows of Y are the concatenated groups, in order)."""
    if not groups:
        return float("nan")
    Y = Y.to(torch.float64)
    d = Y.shape[1]
    sizes = np.array([len(g) for g in groups])
    offs = np.concatenate([[0], np.cumsum(sizes)])
    vals = np.empty(len(groups))
    with serial(Y.device):
        for m in np.unique(sizes):  # one batched eigvalsh per group size
            idx = np.nonzero(sizes == m)[0]
            W = torch.stack([Y[offs[i] : offs[i] + m] for i in idx])  # (batch, m, d)
            G = W @ W.transpose(1, 2) if m <= d else W.transpose(1, 2) @ W
            ev = torch.linalg.eigvalsh(G).clamp(min=0)
            vals[idx] = (ev[:, -1] / ev.sum(dim=1)).cpu().numpy()
    return float(vals.mean())


def layer_anisotropy(X: Any, postprocessings: tuple = ("raw",), *, words: Any = None, sentences: Any = None,
                     k_rogue: int = 3, min_count: int = 2, max_words: int | None = 2000,
                     seed: int = 0) -> dict:
    """``{post-processing: dict of every Anisotropy field}`` for one ``(token, d_model)`` matrix
    (see :func:`geometry.anisotropy.anisotropy` for the fields and the labels).

    Runs on one thread (:func:`lens.threads.serial`): its ops are many and of d_model-sized
    matrices or row chunks, for which a busy machine's barrier waits cost more than a second thread
    gains."""
    T = as_matrix(X, "X", dtype=torch.float32, min_rows=2).contiguous()
    with serial(T.device):
        return _layer(T, postprocessings, words, sentences, k_rogue, min_count, max_words, seed)


def _layer(T, postprocessings, words, sentences, k_rogue, min_count, max_words, seed) -> dict:
    check_finite_rows(T, "X")
    n = T.shape[0]
    dev = T.device
    rng = np.random.default_rng(seed)  # same draws, in the same order, as anisotropy()
    w = _codes(words, n, "words") if words is not None else None
    s = _codes(sentences, n, "sentences") if sentences is not None else None
    w_perm = rng.permutation(w) if w is not None else None
    s_perm = rng.permutation(s) if s is not None else None

    mom = _Moments(T)
    tf = _Transforms(T, mom, tuple(postprocessings), k_rogue)
    L = {name: torch.as_tensor(v, dtype=torch.long, device=dev) for name, v in
         (("w", w), ("s", s), ("sp", s_perm)) if v is not None}
    G = {name: int(v.max()) + 1 for name, v in L.items()}
    acc = {pp: {"su": 0.0, "su2": 0.0} for pp in tf.fns}
    for s0 in range(0, n, _CHUNK):
        C = T[s0 : s0 + _CHUNK]
        rows = slice(s0, s0 + C.shape[0])
        for pp, fn in tf.fns.items():
            Y = fn(C)
            U = _unit(Y)
            a = acc[pp]
            a["su"] = a["su"] + U.sum(dim=0, dtype=torch.float64)
            a["su2"] = a["su2"] + (U * U).sum(dim=0, dtype=torch.float64)
            U64 = U.to(torch.float64) if L else None
            for name in L:
                key = "U" + name
                if key not in a or a[key].shape[1] != U.shape[1]:
                    a[key] = torch.zeros((G[name], U.shape[1]), dtype=torch.float64, device=dev)
                a[key].index_add_(0, L[name][rows], U64)
                if name in ("s", "sp"):
                    if "Y" + name not in a:
                        a["Y" + name] = torch.zeros((G[name], Y.shape[1]), dtype=torch.float64, device=dev)
                    a["Y" + name].index_add_(0, L[name][rows], Y.to(torch.float64))
            if tf.cov[pp] is None:  # clip: covariance of the clipped rows, about the clipped shift
                if "S2" not in a:
                    a["shift"] = fn(mom.shift.to(torch.float32).unsqueeze(0))[0]
                    a["S1"] = torch.zeros(Y.shape[1], dtype=torch.float64, device=dev)
                    a["S2"] = torch.zeros((Y.shape[1], Y.shape[1]), dtype=torch.float64, device=dev)
                Z = Y - a["shift"]
                a["S1"] += Z.sum(dim=0, dtype=torch.float64)
                a["S2"] += (Z.T @ Z).to(torch.float64)

    mev_groups = mev_perm = None
    if w is not None:
        mev_groups = _mev_rows(w, min_count, max_words, seed)
        mev_perm = _mev_rows(w_perm, min_count, max_words, seed)
        sel = np.concatenate(mev_groups + mev_perm) if mev_groups else np.zeros(0, np.int64)
        Xsel = T[torch.as_tensor(sel, dtype=torch.long, device=dev)]
    nan = float("nan")
    out = {}
    for pp, fn in tf.fns.items():
        a = acc[pp]
        cov = tf.cov[pp]
        if cov is None:
            cov = cov_from_sums(n, a["S1"], a["S2"])
        r = _label_free(n, cosine_contributions(n, a["su"], a["su2"]), cov, k_rogue)
        mc = r["mean_cosine"]
        if w is not None:
            m = torch.bincount(L["w"], minlength=G["w"]).to(torch.float64)
            keep = m >= max(2, min_count)
            if bool(keep.any()):
                S = a["Uw"]
                ss = float((((S * S).sum(dim=1)[keep] - m[keep]) / (m[keep] * (m[keep] - 1))).mean())
                r["self_similarity"], r["self_similarity_adjusted"] = ss, ss - mc
            if mev_groups:
                Ysel = fn(Xsel)
                k1 = sum(len(g) for g in mev_groups)
                r["mev"] = _mev(Ysel[:k1], mev_groups)
                r["mev_adjusted"] = r["mev"] - _mev(Ysel[k1:], mev_perm)
        if s is not None:
            isim = []
            for name in ("s", "sp"):
                m = torch.bincount(L[name], minlength=G[name]).to(torch.float64)
                cent = a["Y" + name] / m.unsqueeze(1)
                per = (a["U" + name] * cent).sum(dim=1) / torch.linalg.vector_norm(cent, dim=1).clamp_min(1e-300) / m
                keep = m >= 2
                isim.append(float(per[keep].mean()) if bool(keep.any()) else nan)
            r["intra_sentence_similarity"] = isim[0]
            r["intra_sentence_similarity_adjusted"] = isim[0] - isim[1]
        out[pp] = r
    return out
