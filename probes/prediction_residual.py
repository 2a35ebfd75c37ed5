"""Per-layer prediction residual PR_l (He & Su 2024, "A Law of Next-Token Prediction in LLMs").

PR_l is the residual sum of squares of a linear (ridge) fit from layer-l token states to the one-hot
next token, over the targets' total sum of squares (i.e. 1 − R², variance-weighted over the vocab).
He & Su report that log PR_l falls linearly in l ("equi-learning": each layer multiplies PR by the
same decay ratio ρ), with Pearson r of log PR against l between −0.983 and −0.997.

Protocol here (stricter than the reference code, whose variants are also reported):

* every layer's states pass through a freshly initialised final norm (``norm="rms"`` for
  Llama-style models, ``"layer"`` otherwise, ``None`` for raw states), as in the paper;
* documents are split into train / validation / test by document id; the ridge strength is picked
  from a grid (relative to the mean eigenvalue of the training Gram, so the grid is scale-free) by
  validation RSS, refit on train + validation, and PR is reported on the held-out test documents;
* ``pr_in_sample``: fit and score on all tokens (what the reference code does) with a fixed, tiny
  relative ridge ``in_sample_alpha`` (≈ least squares; tying it to the validation choice would make
  the in-sample curve jump wherever the chosen λ changes between layers);
* ``pr_token_id``: regress the scalar token id instead of the one-hot token, in-sample (what the
  reference code does); kept so users can see how far it is from the one-hot measure;
* a percentile bootstrap over test documents gives an interval per layer and for the law's slope
  and Pearson r (the fit is held fixed; the interval reflects which documents were scored).

The fit never materialises the (token, vocab) target matrix; see ``probes.ridge_closed_form``.
Tokens whose next id is −1 (end of document, the activation store's convention) are dropped.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from probes._common import as_numpy_1d, check_finite, final_norm, get_layer, layer_count, NORMS
from probes.pr_law import PRLawSummary, pr_law_summary
from probes.ridge_closed_form import F64, Moments, fit_moments, rss, scalar_in_sample_rss, token_residuals

__all__ = ["PredictionResidual", "PredictionResidualResult", "LayerPR", "prediction_residual",
           "DEFAULT_ALPHAS", "split_documents"]

log = logging.getLogger(__name__)

#: ridge strengths relative to tr(XcᵀXc)/d_model of the fitting set
DEFAULT_ALPHAS = tuple(float(a) for a in np.logspace(-6, 2, 17))
#: the normalised test rows are kept between the moments pass and the bootstrap's per-token
#: residuals up to this many float64 values (128 MiB), else read and normalised again
_KEEP_TEST_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class LayerPR:
    """Prediction residual of one layer (scalars) plus the validation curve ``val_pr`` (alpha,)."""

    layer: int
    pr: float
    pr_low: float
    pr_high: float
    pr_in_sample: float
    pr_token_id: float
    alpha: float
    alpha_relative: float
    val_pr: np.ndarray


@dataclass(frozen=True)
class PredictionResidualResult:
    """PR per layer. Arrays of shape (layer,) unless stated.

    layers: layer labels; pr: held-out PR; pr_low / pr_high: bootstrap interval over test documents;
    pr_in_sample: fit and score on all tokens; pr_token_id: in-sample PR of the scalar token-id target;
    alpha: absolute ridge strength used for the held-out fit; alpha_relative: the chosen grid value;
    alphas_relative (alpha,): the grid; val_pr (layer, alpha): validation PR over the grid;
    boot_pr (boot, layer): bootstrap replicates of held-out PR; summary / summary_in_sample /
    summary_token_id: the law's fit (slope of log10 PR on layer, ρ, Pearson r, gain shares);
    slope_interval, pearson_interval (2,): bootstrap intervals of the held-out summary;
    n_tokens (3,) and n_docs (3,): train / validation / test sizes; confidence: interval level.
    """

    layers: np.ndarray
    pr: np.ndarray
    pr_low: np.ndarray
    pr_high: np.ndarray
    pr_in_sample: np.ndarray
    pr_token_id: np.ndarray
    alpha: np.ndarray
    alpha_relative: np.ndarray
    alphas_relative: np.ndarray
    val_pr: np.ndarray
    boot_pr: np.ndarray
    summary: PRLawSummary
    summary_in_sample: PRLawSummary
    summary_token_id: PRLawSummary
    slope_interval: np.ndarray
    pearson_interval: np.ndarray
    n_tokens: np.ndarray
    n_docs: np.ndarray
    confidence: float

    def layer(self, i: int) -> LayerPR:
        """The i-th layer (by position, not label) as a ``LayerPR``."""
        return LayerPR(int(self.layers[i]), float(self.pr[i]), float(self.pr_low[i]),
                       float(self.pr_high[i]), float(self.pr_in_sample[i]), float(self.pr_token_id[i]),
                       float(self.alpha[i]), float(self.alpha_relative[i]), self.val_pr[i].copy())


def split_documents(doc_codes: np.ndarray, n_docs: int, val_fraction: float, test_fraction: float,
                    seed: int) -> np.ndarray:
    """Assign each document (codes 0..n_docs-1) to 0 = train, 1 = validation, 2 = test."""
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError("val_fraction, test_fraction: expected each in (0, 1) with a sum below 1, "
                         f"got {val_fraction}, {test_fraction}")
    if n_docs < 3:
        raise ValueError(f"docs: expected at least 3 distinct documents for a train/validation/test "
                         f"split, got {n_docs}")
    n_te = max(1, int(round(test_fraction * n_docs)))
    n_va = max(1, int(round(val_fraction * n_docs)))
    if n_docs - n_te - n_va < 1:
        raise ValueError(f"docs: {n_docs} documents leave none for training with val_fraction="
                         f"{val_fraction}, test_fraction={test_fraction}")
    perm = np.random.default_rng(seed).permutation(n_docs)
    split = np.zeros(n_docs, dtype=np.int64)
    split[perm[:n_te]] = 2
    split[perm[n_te:n_te + n_va]] = 1
    return split


class PredictionResidual:
    """Estimator of the per-layer prediction residual (scikit-learn conventions).

    ``PredictionResidual(norm="rms").fit(X, next_ids, docs)`` with X a (layer, token, d_model) array
    or a sequence of (token, d_model) arrays (numpy or torch, CPU or CUDA), ``next_ids`` (token,) the
    next token ids (−1 = none, dropped) and ``docs`` (token,) document ids for the split and the
    bootstrap. Fitted attributes end in ``_``; ``result_`` holds everything.
    """

    def __init__(self, norm: str | None = "rms", eps: float = 1e-5, alphas=DEFAULT_ALPHAS,
                 val_fraction: float = 0.2, test_fraction: float = 0.2, n_boot: int = 1000,
                 confidence: float = 0.95, seed: int = 0, chunk_size: int = 8192, device=None,
                 layers=None, progress: bool = False, in_sample_alpha: float = 1e-6):
        self.norm = norm
        self.eps = eps
        self.alphas = alphas
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.n_boot = n_boot
        self.confidence = confidence
        self.seed = seed
        self.chunk_size = chunk_size
        self.device = device
        self.layers = layers
        self.progress = progress
        self.in_sample_alpha = in_sample_alpha

    # -- input checks -------------------------------------------------------------------------
    def _check_params(self) -> np.ndarray:
        if self.norm not in NORMS:
            raise ValueError(f"norm: expected one of 'rms', 'layer' or None, got {self.norm!r}")
        alphas = np.asarray(self.alphas, dtype=np.float64).reshape(-1)
        if alphas.size == 0 or not np.all(np.isfinite(alphas)) or np.any(alphas <= 0):
            raise ValueError(f"alphas: expected a non-empty grid of positive numbers, got {self.alphas!r}")
        if not self.in_sample_alpha > 0:
            raise ValueError(f"in_sample_alpha: expected a positive relative ridge, got {self.in_sample_alpha}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence: expected a level in (0, 1), got {self.confidence}")
        if self.n_boot < 0 or self.chunk_size < 1:
            raise ValueError(f"n_boot >= 0 and chunk_size >= 1 expected, got {self.n_boot}, {self.chunk_size}")
        return alphas

    def fit(self, X, next_ids, docs) -> "PredictionResidual":
        alphas = self._check_params()
        n_layers = layer_count(X)
        lazy = hasattr(X, "take") and hasattr(X, "n_tokens") and hasattr(X, "store")
        # a lens LayerView: each chunk of rows is read from the store when it is needed (no layer held)
        x0 = _LazyLayer(X, 0) if lazy else get_layer(X, 0)
        n_tok, d = int(x0.shape[0]), int(x0.shape[1])
        device = torch.device(self.device) if self.device is not None else x0.device
        nxt = as_numpy_1d(next_ids, "next_ids", n_tok)
        if not np.issubdtype(nxt.dtype, np.integer):
            raise ValueError(f"next_ids: expected integer token ids, got dtype {nxt.dtype}")
        nxt = nxt.astype(np.int64, copy=False)
        if (nxt < -1).any():
            raise ValueError(f"next_ids: expected token ids >= 0 (or -1 for none), got minimum {nxt.min()}")
        doc_arr = as_numpy_1d(docs, "docs", n_tok)
        keep = nxt >= 0
        if keep.sum() < 2:
            raise ValueError(f"next_ids: expected at least 2 tokens with a next token, got {int(keep.sum())}")
        doc_ids, doc_codes = np.unique(doc_arr[keep], return_inverse=True)
        doc_split = split_documents(doc_codes, len(doc_ids), self.val_fraction, self.test_fraction, self.seed)
        rows = np.flatnonzero(keep)
        tok_split = doc_split[doc_codes]
        classes, cls_all = np.unique(nxt[keep], return_inverse=True)
        n_split = np.bincount(tok_split, minlength=3)
        if n_split[0] < 2 or n_split[2] < 2 or n_split[1] < 1:
            raise ValueError(f"tokens: expected at least 2 train, 1 validation and 2 test tokens, got "
                             f"{n_split.tolist()} after splitting {len(doc_ids)} documents")
        if len(np.unique(cls_all[tok_split == 2])) < 2:
            raise ValueError("next_ids: expected at least 2 distinct next tokens among the test documents "
                             "(their target variance is zero otherwise)")
        self.train_docs_ = doc_ids[doc_split == 0]
        self.val_docs_ = doc_ids[doc_split == 1]
        self.test_docs_ = doc_ids[doc_split == 2]
        self.classes_ = classes
        self.n_features_in_ = d

        split_rows = [torch.as_tensor(rows[tok_split == k]) for k in range(3)]
        split_cls = [torch.as_tensor(cls_all[tok_split == k], device=device) for k in range(3)]
        split_tgt = [torch.as_tensor(nxt[rows[tok_split == k]], dtype=F64, device=device) for k in range(3)]
        split_classes = [torch.unique(c) for c in split_cls]
        test_doc_codes = np.unique(doc_codes[tok_split == 2], return_inverse=True)[1]
        boot_w, boot_tss = self._bootstrap_plan(test_doc_codes, cls_all[tok_split == 2], len(classes))

        out = {k: [] for k in ("pr", "ins", "tok", "alpha", "rel", "val", "boot")}
        it = tqdm(range(n_layers), desc="prediction residual", unit="layer", disable=not self.progress)
        for i in it:
            xl = x0 if i == 0 else (_LazyLayer(X, i) if lazy else get_layer(X, i, n_tok, d))
            res = self._fit_layer(i, xl, split_rows, split_cls, split_classes, split_tgt, len(classes), alphas,
                                  device, test_doc_codes, boot_w, boot_tss)
            for k, v in res.items():
                out[k].append(v)
        self._finish(out, alphas, n_layers, n_split, doc_split)
        return self

    # -- per layer ----------------------------------------------------------------------------
    def _chunks(self, xl, rows, device, name):
        for start in range(0, len(rows), self.chunk_size):
            idx = rows[start:start + self.chunk_size]
            x = xl[idx.to(xl.device)].to(device=device, dtype=F64)
            check_finite(x, name)
            yield start, final_norm(x, self.norm, self.eps)

    def _fit_layer(self, i, xl, split_rows, split_cls, split_classes, split_tgt, n_classes, alphas, device,
                   test_doc_codes, boot_w, boot_tss):
        name = f"X[{i}]"
        train_chunks = self._chunks(xl, split_rows[0], device, name)
        first = next(train_chunks)                  # read and normalised once: the shift, then summed
        shift = first[1].mean(0)                    # conditioning only: sums are taken about it
        # the test rows are scored again for the bootstrap: kept (shifted) when they are few enough
        keep_test = self.n_boot > 0 and len(split_rows[2]) * xl.shape[1] <= _KEEP_TEST_ELEMENTS
        kept = []
        mom = []
        for k in range(3):
            m = Moments.zeros(xl.shape[1], n_classes, device, classes=split_classes[k])  # its own classes only
            it = itertools.chain([first], train_chunks) if k == 0 else self._chunks(xl, split_rows[k], device, name)
            for start, x in it:
                sl = slice(start, start + x.shape[0])
                xs = x - shift
                m.add_rows(xs, split_cls[k][sl], split_tgt[k][sl])
                if k == 2 and keep_test:
                    kept.append((start, xs))
            mom.append(m)
        m_tr, m_va, m_te = mom
        # the class Grams of every fit below from six products of the three splits' per-class tables
        products: dict = {}
        # 1. choose the relative ridge strength on validation documents
        fit_tr = fit_moments(m_tr, cache=products)
        val_rss = rss(fit_tr, m_va, torch.as_tensor(alphas * fit_tr.mean_ev, dtype=F64), cache=products)
        val_pr = (val_rss / max(m_va.target_ss(), 1e-300)).cpu().numpy()
        best = int(np.argmin(val_pr))
        rel = float(alphas[best])
        # 2. refit on train + validation, score held-out test documents
        m_tv = m_tr + m_va
        fit_tv = fit_moments(m_tv, cache=products)
        lam = rel * fit_tv.mean_ev
        tss_te = m_te.target_ss()
        pr = float(rss(fit_tv, m_te, torch.tensor([lam], dtype=F64), cache=products)[0]) / tss_te
        boot = np.empty(0)
        if self.n_boot > 0:
            cache: dict = {"needed": torch.unique(split_cls[2])}
            per_tok = torch.empty(len(split_rows[2]), dtype=F64, device=device)
            test_chunks = kept if keep_test else ((start, x - shift) for start, x in
                                                  self._chunks(xl, split_rows[2], device, name))
            for start, xs in test_chunks:
                sl = slice(start, start + xs.shape[0])
                per_tok[sl] = token_residuals(fit_tv, lam, xs, split_cls[2][sl], cache)
            per_doc = np.bincount(test_doc_codes, weights=per_tok.cpu().numpy(),
                                  minlength=boot_w.shape[1])
            boot = (boot_w @ per_doc) / boot_tss
        # 3. the reference code's variants: in-sample one-hot, in-sample token id (one eigendecomposition)
        m_all = m_tv + m_te
        fit_all = fit_moments(m_all, in_sample_only=True, cache=products)
        del products
        lam_all = self.in_sample_alpha * fit_all.mean_ev
        ins = float(rss(fit_all, m_all, torch.tensor([lam_all], dtype=F64))[0]) / m_all.target_ss()
        tok_rss, tok_tss = scalar_in_sample_rss(m_all, lam_all, fit_all)
        tok = tok_rss / tok_tss if tok_tss > 0 else float("nan")
        log.debug("layer %d: PR %.4g (in-sample %.4g, token id %.4g), alpha_rel %.1e", i, pr, ins, tok, rel)
        return {"pr": pr, "ins": ins, "tok": tok, "alpha": lam, "rel": rel, "val": val_pr, "boot": boot}

    # -- bootstrap over test documents --------------------------------------------------------
    def _bootstrap_plan(self, test_doc_codes, test_cls, n_classes):
        """Document multiplicities (boot, test_doc) and each replicate's target sum of squares.

        Each test document's share of the targets' sum of squares is taken about the mean of the
        whole test set, so that a replicate's PR is a ratio of sums of per-document terms,
        Σ w_d RSS_d / Σ w_d TSS_d. (Re-centring each replicate at its own mean would bias PR upward:
        repeated documents lower the plug-in variance, enough to push the interval off the estimate
        when PR is near 1.)
        """
        n_docs = int(test_doc_codes.max()) + 1
        if self.n_boot == 0:
            return np.zeros((0, n_docs)), np.zeros(0)
        q = np.bincount(test_cls, minlength=n_classes) / len(test_cls)
        tss_tok = 1.0 - 2.0 * q[test_cls] + q @ q
        tss_doc = np.bincount(test_doc_codes, weights=tss_tok, minlength=n_docs)
        rng = np.random.default_rng(self.seed + 1)
        draws = rng.integers(0, n_docs, size=(self.n_boot, n_docs))
        w = np.stack([np.bincount(row, minlength=n_docs) for row in draws]).astype(np.float64)
        tss = w @ tss_doc
        tss[tss <= 0] = np.nan
        return w, tss

    def _finish(self, out, alphas, n_layers, n_split, doc_split):
        layers = np.arange(n_layers) if self.layers is None else np.asarray(self.layers)
        if layers.shape != (n_layers,):
            raise ValueError(f"layers: expected {n_layers} labels, got shape {layers.shape}")
        pr = np.asarray(out["pr"])
        if self.n_boot > 0:
            boot = np.stack(out["boot"], axis=1)                    # (boot, layer)
            q = (1 - self.confidence) / 2
            lo, hi = np.nanquantile(boot, [q, 1 - q], axis=0)
            slopes, rs = [], []
            for row in boot:
                if np.all(np.isfinite(row)) and np.all(row > 0) and n_layers >= 2:
                    s = pr_law_summary(layers, row)
                    slopes.append(s.slope_log10)
                    rs.append(s.pearson_r)
            slope_iv = np.nanquantile(slopes, [q, 1 - q]) if slopes else np.full(2, np.nan)
            r_iv = np.nanquantile(rs, [q, 1 - q]) if rs else np.full(2, np.nan)
        else:
            boot = np.zeros((0, n_layers))
            lo = hi = np.full(n_layers, np.nan)
            slope_iv = r_iv = np.full(2, np.nan)
        ins, tok = np.asarray(out["ins"]), np.asarray(out["tok"])
        self.result_ = PredictionResidualResult(
            layers=layers, pr=pr, pr_low=np.asarray(lo), pr_high=np.asarray(hi), pr_in_sample=ins,
            pr_token_id=tok, alpha=np.asarray(out["alpha"]), alpha_relative=np.asarray(out["rel"]),
            alphas_relative=alphas, val_pr=np.stack(out["val"]), boot_pr=boot,
            summary=pr_law_summary(layers, pr), summary_in_sample=pr_law_summary(layers, ins),
            summary_token_id=pr_law_summary(layers, tok), slope_interval=np.asarray(slope_iv),
            pearson_interval=np.asarray(r_iv), n_tokens=n_split.astype(np.int64),
            n_docs=np.bincount(doc_split, minlength=3), confidence=float(self.confidence))
        r = self.result_
        self.pr_, self.pr_low_, self.pr_high_ = r.pr, r.pr_low, r.pr_high
        self.pr_in_sample_, self.pr_token_id_ = r.pr_in_sample, r.pr_token_id
        self.alpha_, self.alpha_relative_, self.val_pr_ = r.alpha, r.alpha_relative, r.val_pr
        self.summary_ = r.summary


def prediction_residual(X, next_ids, docs, **params) -> LayerPR:
    """PR of a single layer's states ``X`` (token, d_model); keyword ``params`` as for the estimator."""
    est = PredictionResidual(**params).fit([X], next_ids, docs)
    return est.result_.layer(0)


class _LazyLayer:
    """Layer ``i`` of a lazy layer view (:class:`lens.store.views.LayerView`) indexed by rows: each
    ``[rows]`` reads only those rows (the values a whole layer read then indexed would give)."""

    def __init__(self, view, i: int):
        self.view, self.i = view, i
        width = (view.store.manifest.get("widths") or {}).get(view.site.value, view.store.d_model)
        self.shape = (int(view.n_tokens), int(width))
        self.device = torch.device(view.store.device or "cpu")

    def __getitem__(self, rows):
        rows = rows.cpu().numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)
        return self.view.take(rows)[self.i]
