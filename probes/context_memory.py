"""Context memory (LLM-Microscope, Razzhigaev et al. 2025): how much of a token's prefix can be read
back from its state.

At each layer a linear (ridge) probe maps the state h_i to the vectors of the previous k tokens,
t_{i−1}, …, t_{i−k}; the per-token score is how well they are recovered on held-out documents.
LLM-Microscope finds that filler tokens (determiners, punctuation, other stop words) carry the most
context, and that contextualisation goes with linearity.

Why embedding vectors and not token ids as targets. Predicting the previous ids is a classification
over the whole vocabulary (49k classes for SmolLM2): with a few thousand probe tokens most ids occur
once or never in training, so a classifier cannot even output them and its accuracy mostly measures
how frequent the previous token is. A token's vector (the model's input embedding — the store's
``embed`` site — or any per-token vector the caller passes) is a fixed-width dense target with one
geometry shared by all tokens: the ridge map generalises to tokens never seen in training, and the
squared error is defined for every token. The per-token score for offset j is

    s_ij = 1 − ‖ĥ_ij − t_{i−j}‖² / v_j,   v_j = mean over test tokens of ‖t_{i−j} − t̄_j‖²,

so that the mean of s_ij over test tokens is the held-out R² (variance-weighted over the target
dimensions); a token's score averages its available offsets (NaN at a document's first token).

Axes: X (layer, token, d_model) or a sequence of (token, d_model); targets (token, d_target); docs and
positions (token,), rows in document order so that token i−j is the j-th predecessor when it has the
same document and position − j. The ridge strength is chosen on validation documents (grid relative
to tr(XᵀX)/d), refit on train + validation, scored on test documents.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from probes._common import NORMS, as_numpy_1d, as_tensor, check_finite, final_norm, get_layer, layer_count
from probes.prediction_residual import DEFAULT_ALPHAS, split_documents
from geometry.arrays import lapack_threads
from probes.ridge_closed_form import eigh

__all__ = ["ContextMemoryProbe", "ContextMemoryResult", "aggregate_by_class", "previous_index"]

log = logging.getLogger(__name__)
F64 = torch.float64


@dataclass(frozen=True)
class ContextMemoryResult:
    """layers (layer,); score (layer,): held-out R² averaged over offsets; score_by_offset (layer, k);
    token_scores (layer, test_token): per-token score (NaN where no predecessor); test_rows
    (test_token,): the rows of the input the per-token scores belong to; alpha_relative (layer,)."""

    layers: np.ndarray
    k: int
    score: np.ndarray
    score_by_offset: np.ndarray
    token_scores: np.ndarray
    test_rows: np.ndarray
    alpha_relative: np.ndarray


def previous_index(docs, positions, k: int) -> np.ndarray:
    """(token, k) index of each token's j-th predecessor (column j−1), −1 where there is none."""
    docs = np.asarray(docs)
    pos = np.asarray(positions, dtype=np.int64)
    n = len(docs)
    out = np.full((n, k), -1, dtype=np.int64)
    idx = np.arange(n)
    for j in range(1, k + 1):
        prev = idx - j
        ok = prev >= 0
        ok[ok] &= (docs[prev[ok]] == docs[ok]) & (pos[prev[ok]] == pos[ok] - j)
        out[ok, j - 1] = prev[ok]
    return out


def aggregate_by_class(token_scores: np.ndarray, classes) -> tuple[list, np.ndarray]:
    """Mean per-token score by class: returns (class names, array (layer, class)), NaN-aware."""
    classes = np.asarray(classes)
    if classes.shape[0] != token_scores.shape[-1]:
        raise ValueError(f"classes: expected {token_scores.shape[-1]} entries (one per scored token), "
                         f"got {classes.shape[0]}")
    names = list(np.unique(classes))
    out = np.full((token_scores.shape[0], len(names)), np.nan)
    for c, name in enumerate(names):
        cols = token_scores[:, classes == name]
        ok = np.isfinite(cols)
        out[:, c] = np.where(ok.any(1), np.nansum(cols, 1) / np.maximum(ok.sum(1), 1), np.nan)
    return names, out


class ContextMemoryProbe:
    """``ContextMemoryProbe(k=3).fit(X, targets, docs, positions)``; fitted ``result_``, ``score_``."""

    def __init__(self, k: int = 3, norm: str | None = None, alphas=DEFAULT_ALPHAS, val_fraction: float = 0.2,
                 test_fraction: float = 0.2, seed: int = 0, device=None, layers=None, progress: bool = False):
        self.k = k
        self.norm = norm
        self.alphas = alphas
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.device = device
        self.layers = layers
        self.progress = progress

    def fit(self, X, targets, docs, positions) -> "ContextMemoryProbe":
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k: expected a positive integer, got {self.k!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm: expected one of 'rms', 'layer' or None, got {self.norm!r}")
        alphas = np.asarray(self.alphas, dtype=np.float64).reshape(-1)
        n_layers = layer_count(X)
        x0 = get_layer(X, 0)
        n, d = int(x0.shape[0]), int(x0.shape[1])
        device = torch.device(self.device) if self.device is not None else x0.device
        T = as_tensor(targets, "targets", ndim=2, device=device).to(F64)
        if T.shape[0] != n:
            raise ValueError(f"targets: expected {n} rows (one per token), got {T.shape[0]}")
        check_finite(T, "targets")
        doc = as_numpy_1d(docs, "docs", n)
        pos = as_numpy_1d(positions, "positions", n)
        prev = previous_index(doc, pos, self.k)
        doc_ids, codes = np.unique(doc, return_inverse=True)
        split = split_documents(codes, len(doc_ids), self.val_fraction, self.test_fraction, self.seed)[codes]
        full = (prev >= 0).all(1)
        fit_rows = [np.flatnonzero(full & (split == s)) for s in (0, 1)]
        test_rows = np.flatnonzero((split == 2) & (prev[:, 0] >= 0))
        if min(len(fit_rows[0]), len(fit_rows[1])) < 2 or len(test_rows) < 2:
            raise ValueError(f"tokens: expected at least 2 train, 2 validation and 2 test tokens with "
                             f"{self.k} predecessors, got {len(fit_rows[0])}, {len(fit_rows[1])}, {len(test_rows)}")
        # Y row i = [t_{i-1}, ..., t_{i-k}] (NaN where a predecessor is missing)
        dt = T.shape[1]
        Y = torch.full((n, self.k * dt), float("nan"), dtype=F64, device=device)
        for j in range(self.k):
            ok = torch.as_tensor(prev[:, j] >= 0, device=device)
            Y[ok, j * dt:(j + 1) * dt] = T[torch.as_tensor(prev[prev[:, j] >= 0, j], device=device)]
        targets = _Targets(Y, fit_rows, test_rows, prev, self.k, dt)
        del Y

        score, by_off, tok, rel = [], [], [], []
        for i in tqdm(range(n_layers), desc="context memory", unit="layer", disable=not self.progress):
            x = (x0 if i == 0 else get_layer(X, i, n, d)).to(device=device, dtype=F64)
            check_finite(x, f"X[{i}]")
            x = final_norm(x, self.norm)
            s_tok, s_off, r = self._layer(x, targets, alphas)
            tok.append(s_tok)
            by_off.append(s_off)
            score.append(float(np.nanmean(s_off)))
            rel.append(r)
        layers = np.arange(n_layers) if self.layers is None else np.asarray(self.layers)
        self.result_ = ContextMemoryResult(layers, self.k, np.asarray(score), np.stack(by_off), np.stack(tok),
                                           test_rows, np.asarray(rel))
        self.score_ = self.result_.score
        return self

    def _layer(self, x, t: "_Targets", alphas):
        xtr, xva = x[t.rows[0]], x[t.rows[1]]
        mx = xtr.mean(0)
        xc = xtr - mx
        G = xc.T @ xc
        ev, Q = eigh(G)
        C = xc.T @ t.yc
        Bt = Q.T @ C
        xe = xva - mx
        Ge, Ce = xe.T @ xe, xe.T @ t.ye
        Gt = Q.T @ Ge @ Q
        a = (Bt * (Q.T @ Ce)).sum(1)
        M = Bt @ Bt.T
        lams = torch.as_tensor(alphas * float(ev.mean()), dtype=F64, device=x.device)
        D = 1.0 / (ev[None, :] + lams[:, None])
        val_rss = t.ye_ss - 2.0 * (D @ a) + ((D @ (Gt * M)) * D).sum(1)
        best = int(torch.argmin(val_rss))
        rel = float(alphas[best])
        # refit on train + validation, predict the test tokens. Its centred Gram and cross-products
        # follow from the two sets' ones about the train mean (z = [xc; xe], w = [yc; ye]):
        # Σ(z − z̄)(z − z̄)ᵀ = G + Ge − N z̄z̄ᵀ and Σ(z − z̄)(w − w̄)ᵀ = C + Ce − N z̄w̄ᵀ
        n_all = xtr.shape[0] + xva.shape[0]
        zbar = (xc.sum(0) + xe.sum(0)) / n_all
        G = G + Ge - n_all * torch.outer(zbar, zbar)
        C = C + Ce - n_all * torch.outer(zbar, t.wbar)
        lam = rel * float(torch.diagonal(G).mean())
        with lapack_threads(x.device):  # one thread: contended multi-threaded LAPACK spin-waits
            W = torch.linalg.solve(G + lam * torch.eye(G.shape[0], dtype=F64, device=x.device), C)
        pred = (x[t.test] - (mx + zbar)) @ W + t.my_all
        s = torch.full((len(t.test_rows), self.k), float("nan"), dtype=F64, device=x.device)
        for j, (ok, tj, v) in enumerate(t.offsets):
            if v > 0:
                sl = slice(j * t.dt, (j + 1) * t.dt)
                s[ok, j] = 1.0 - ((pred[ok, sl] - tj) ** 2).sum(1) / v
        s = s.cpu().numpy()
        return np.nanmean(np.where(np.isfinite(s), s, np.nan), axis=1), np.nanmean(s, axis=0), rel


class _Targets:
    """What the per-layer fits need of the targets, which do not depend on the layer: computed once.

    rows: train / validation row indices; yc: train targets centred at their mean; ye: validation
    targets centred at the train mean, ye_ss = Σ ye²; my_all: the train + validation targets' mean,
    wbar: the mean of [yc; ye]; test: test row indices; offsets: per predecessor offset
    j, (which test rows have it, their target block t_{i−j}, its variance v_j over those rows).
    """

    def __init__(self, Y, fit_rows, test_rows, prev, k: int, dt: int):
        dev = Y.device
        self.rows = [torch.as_tensor(r, device=dev) for r in fit_rows]
        self.test_rows, self.dt = test_rows, dt
        self.test = torch.as_tensor(test_rows, device=dev)
        ytr, yva = Y[self.rows[0]], Y[self.rows[1]]
        my = ytr.mean(0)
        self.yc, self.ye = ytr - my, yva - my
        self.ye_ss = float((self.ye * self.ye).sum())
        self.my_all = torch.cat([ytr, yva]).mean(0)
        self.wbar = (self.yc.sum(0) + self.ye.sum(0)) / (ytr.shape[0] + yva.shape[0])
        yt = Y[self.test]
        self.offsets = []
        for j in range(k):
            ok = torch.as_tensor(prev[test_rows, j] >= 0, device=dev)
            tj = yt[ok, j * dt:(j + 1) * dt]
            self.offsets.append((ok, tj, float(((tj - tj.mean(0)) ** 2).sum(1).mean())))
