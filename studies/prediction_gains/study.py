"""Study: per-layer prediction gains — the equi-learning law of He & Su (2024).

The claim is judged on the paper's own recipe (``probes.token_id_pr``): for every block's output
(``resid_post``), PR_l of the in-sample least-squares fit of the next token's id, a scalar, and Pearson r of
log PR_l against l, with a delete-one-group jackknife interval over whole documents and the same fit on
nested subsamples of the documents (``nested__pearson_r_token_id``: an in-sample fit drifts with the
tokens per dimension). Beside it, ours: PR_l of a ridge fit to the one-hot next token
(``probes.PredictionResidual``), held out by document (or by window when the corpus has too few
documents for a split), with a bootstrap interval, and its in-sample variant. Summary: slope of log10 PR
on layer, decay ratio ρ, Pearson r.
Beside it, the logit-lens cross-entropy per layer (``lens.readout.logit_lens``: each layer decoded by the
model's own final norm and unembedding) and its drop from the layer before.

Every state passes a fresh final norm first (``norm``; "auto" = the kind of the model's own final
norm, read from its card; LayerNorm for a model without one — ``norm_source`` says which).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import plotly.graph_objects as go

from lens.errors import LensInputError
from studies.core import stability
from studies.core.config import SiteConfig, resolve_norm
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core.sampling import sample_windows, split_units
from studies.prediction_gains.declaration import A, CLAIMS, HEADLINES, M, RESULT, S
from lens.readout.store_lens import store_logit_lens
from probes.prediction_residual import PredictionResidual
from probes.token_id_pr import TokenIdPR


@dataclass(frozen=True)
class Config(SiteConfig):
    """``norm``: "auto" (the model's own final-norm kind, from its card), "rms", "layer" or "none";
    ``split_by``: "auto" (documents when there are at least ``min_docs``, else capture windows), "doc",
    "window"; ``n_boot``: bootstrap replicates over test documents; ``drop_special``: leave BOS/CLS/SEP
    states out (their norms are outliers and they predict nothing); ``logit_lens``: write the
    logit-lens cross-entropy per layer beside PR (loads the model even when a store is reused), on
    ``logit_lens_max_tokens`` scored tokens in whole windows drawn at random (0 = all); ``jackknife_groups``:
    the most groups of whole units the paper's-recipe interval leaves out one at a time."""

    norm: str = "auto"
    split_by: str = "auto"
    min_docs: int = 10
    val_fraction: float = 0.2
    test_fraction: float = 0.2
    n_boot: int = 1000
    drop_special: bool = True
    logit_lens: bool = True
    logit_lens_max_tokens: int = 2000
    jackknife_groups: int = 20


def check(config: Config) -> None:
    if config.jackknife_groups < 2:
        raise LensInputError(f"jackknife_groups: expected at least 2 groups, got {config.jackknife_groups}")


def needs(config: Config) -> Needs:
    return Needs(sites=(config.site,), model=config.logit_lens, lm_head=config.logit_lens, causal=True)


def lens_rows(tokens: dict, scored: np.ndarray, max_tokens: int, seed: int = 0) -> np.ndarray:
    """Store rows of whole windows drawn at random as the logit-lens study draws its sample
    (:func:`studies.core.sampling.sample_windows`, same seed: the smaller sample's windows are among the
    larger's), just enough of them to hold ``max_tokens`` scored tokens (0 = every row)."""
    n = len(scored)
    budget = max_tokens
    while max_tokens:
        rows = sample_windows(tokens, budget, seed)
        if rows is None:
            break
        got = int(scored[rows].sum())
        if got >= max_tokens:
            return rows
        budget += max_tokens - got
    return np.arange(n)


def _logit_lens_ce(model, store, site, scored, progress, max_tokens: int = 0, seed: int = 0):
    """Logit-lens cross-entropy per layer (``lens.readout.logit_lens``) over ``max_tokens`` scored tokens in
    whole windows drawn at random. Decoding costs tokens × layers × d_model × vocab (35 TFLOP for
    20k tokens of SmolLM2), so the column uses a sample; a mean CE needs far fewer tokens than PR.
    Decoded through :mod:`lens.readout.store_lens`: in a main job the logit-lens study's larger sample,
    drawn the same way with the same seed, holds these windows, and their tokens are decoded once."""
    rows = lens_rows(store.tokens, scored, max_tokens, seed)
    res = store_logit_lens(model, store, rows, site=site, mask=scored[rows], progress=progress)
    return (np.asarray(res.ce, dtype=np.float64),
            f"lens.readout.logit_lens on {res.n_scored} tokens in whole windows (final norm + unembedding)")


def token_id_fit(config: Config, store, norm, next_ids, units, share=None):
    """The paper's recipe: in-sample least squares of the next token's id, jackknife over whole units, nested fits
    (:class:`probes.token_id_pr.TokenIdPR`); ``share``: this process's rows and how sums are added up across
    processes (:mod:`studies.prediction_gains.ranks`: the same fit by N torchrun ranks)."""
    view = store.view(config.site)
    try:
        return TokenIdPR(norm=norm, layers=view.layers, max_groups=config.jackknife_groups, seed=config.seed,
                         progress=config.progress).fit(view, next_ids, units,
                                                       stability.nested_units(units, config.seed), share).result_
    except ValueError as exc:
        raise LensInputError(f"{exc} (store has {store.n_tokens} tokens; raise --max-tokens)") from None


def fit_targets(config: Config, store) -> tuple[np.ndarray, np.ndarray, str]:
    """(next token ids with -1 where a row is left out, the unit of each row, the unit kind) as the fits take them."""
    toks = store.tokens
    units, unit_kind = split_units(toks, config.split_by, config.min_docs)
    next_ids = np.asarray(toks["next_token_id"], dtype=np.int64).copy()
    if config.drop_special:
        next_ids[~store.mask()] = -1      # -1 rows are dropped by the probe
    return next_ids, units, unit_kind


def compute(config: Config, inputs: Inputs) -> StudyResult:
    store = inputs.store
    norm, norm_source = resolve_norm(config.norm, inputs.card)
    view = store.view(config.site)
    next_ids, units, unit_kind = fit_targets(config, store)
    try:
        est = PredictionResidual(norm=norm, val_fraction=config.val_fraction, test_fraction=config.test_fraction,
                                 n_boot=config.n_boot, seed=config.seed, layers=view.layers,
                                 progress=config.progress).fit(view, next_ids, units)
    except ValueError as exc:
        raise LensInputError(f"{exc} (store has {store.n_tokens} tokens in "
                             f"{len(np.unique(units))} {unit_kind}s; raise --max-tokens)") from None
    r = est.result_
    tok = token_id_fit(config, store, norm, next_ids, units)
    s, si, st = r.summary, r.summary_in_sample, tok.summary
    metrics = {M.pr: r.pr, M.pr_low: r.pr_low, M.pr_high: r.pr_high, M.pr_in_sample: r.pr_in_sample,
               M.pr_token_id: tok.pr, M.gain_share: s.gain_share, M.alpha_relative: r.alpha_relative}
    summary = {S.pearson_r: s.pearson_r, S.decay_ratio: s.decay_ratio, S.slope_log10: s.slope_log10,
               S.intercept_log10: s.intercept_log10,
               S.pearson_r_low: r.pearson_interval[0], S.pearson_r_high: r.pearson_interval[1],
               S.slope_log10_low: r.slope_interval[0], S.slope_log10_high: r.slope_interval[1],
               S.pearson_r_in_sample: si.pearson_r, S.decay_ratio_in_sample: si.decay_ratio,
               S.slope_log10_in_sample: si.slope_log10, S.pearson_r_token_id: st.pearson_r,
               S.decay_ratio_token_id: st.decay_ratio, S.slope_log10_token_id: st.slope_log10,
               S.pearson_r_token_id_low: float(tok.pearson_interval[0]),
               S.pearson_r_token_id_high: float(tok.pearson_interval[1]),
               S.n_tokens_token_id: tok.n_tokens, S.n_groups_token_id: tok.n_groups,
               **stability.record(S.pearson_r_token_id, tok.nested_r, tok.nested_n),
               S.n_train_tokens: int(r.n_tokens[0]), S.n_val_tokens: int(r.n_tokens[1]),
               S.n_test_tokens: int(r.n_tokens[2]), S.split_unit: unit_kind, S.norm: str(norm),
               S.norm_source: norm_source, S.logit_lens: "not requested"}
    if config.logit_lens:
        ce, how = _logit_lens_ce(inputs.model, store, config.site, next_ids >= 0, config.progress,
                                 config.logit_lens_max_tokens, config.seed)
        summary[S.logit_lens] = how
        metrics[M.logit_lens_ce] = ce
        metrics[M.logit_lens_ce_drop] = np.concatenate([[np.nan], ce[:-1] - ce[1:]])
        summary[S.logit_lens_ce_last] = float(ce[-1])
    arrays = {A.layers: np.asarray(view.layers), A.pr: r.pr, A.pr_low: r.pr_low, A.pr_high: r.pr_high,
              A.pr_in_sample: r.pr_in_sample, A.pr_token_id: r.pr_token_id, A.val_pr: r.val_pr,
              A.alphas_relative: r.alphas_relative, A.alpha: r.alpha, A.boot_pr: r.boot_pr}
    return StudyResult(model=store.model_id, corpus=inputs.corpus, n_tokens=int(r.n_tokens.sum()),
                       layers=list(view.layers), metrics=metrics, summary=summary, arrays=arrays)


def figures(result: StudyResult, config: Config) -> dict:
    m, s = result.metrics, result.summary
    x = np.asarray(result.layers, dtype=float)
    pr, lo, hi = (np.asarray(m[k], float) for k in (M.pr, M.pr_low, M.pr_high))
    main = go.Figure()
    main.add_trace(go.Scatter(x=x, y=pr, mode="markers+lines", name="held-out PR",
                              error_y=dict(type="data", symmetric=False, array=hi - pr, arrayminus=pr - lo)))
    main.add_trace(go.Scatter(x=x, y=10 ** (s[S.intercept_log10] + s[S.slope_log10] * x), mode="lines",
                              line=dict(dash="dash"),
                              name=f"fit: ρ={s[S.decay_ratio]:.3f}, r={s[S.pearson_r]:.3f}"))
    main.add_trace(go.Scatter(x=x, y=m[M.pr_in_sample], mode="markers+lines", name="in-sample PR (reference code)",
                              line=dict(dash="dot")))
    main.add_trace(go.Scatter(x=x, y=m[M.pr_token_id], mode="markers+lines",
                              name=f"paper's recipe: token id, in-sample (r={s[S.pearson_r_token_id]:.3f})",
                              line=dict(dash="dot")))
    main.update_layout(title=f"Prediction residual per layer — {result.model}, {result.n_tokens} tokens "
                             f"(r={s[S.pearson_r]:.3f}, ρ={s[S.decay_ratio]:.3f})",
                       xaxis_title=RESULT.axis(result).title, yaxis_title="prediction residual PR (log scale)", yaxis_type="log",
                       template="plotly_white")
    figs = {"main": main}
    if M.logit_lens_ce in m:  # held-out PR (log scale, left) and logit-lens cross-entropy (right)
        lens = go.Figure()
        lens.add_trace(go.Scatter(x=result.layers, y=pr, mode="markers+lines", name="held-out PR"))
        lens.add_trace(go.Scatter(x=result.layers, y=m[M.logit_lens_ce], mode="markers+lines",
                                  name="logit-lens cross-entropy (nats)", yaxis="y2"))
        lens.update_layout(title=f"Prediction residual and logit-lens cross-entropy — {result.model}",
                           xaxis_title=RESULT.axis(result).title, template="plotly_white",
                           yaxis=dict(title="PR (log scale)", type="log"),
                           yaxis2=dict(title="cross-entropy to the next token", overlaying="y", side="right"))
        figs["logit-lens"] = lens
    return figs


STUDY = Study(
    cost=70, worker_group="store-lens",
    needs_all_positions="its law is over every token of the text, and its logit-lens column decodes whole windows",
    config=Config, check=check, needs=needs, compute=compute, figures=figures, result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
