"""Study: per-layer prediction gains — the equi-learning law of He & Su (2024).

For every layer's residual stream (``resid_post``), the prediction residual PR_l of a ridge fit to
the one-hot next token (``probes.PredictionResidual``): held out by document (or by window when the
corpus has too few documents for a split), with a bootstrap interval, beside the reference code's
in-sample and token-id variants. Summary: slope of log10 PR on layer, decay ratio ρ, Pearson r.
Beside it, the logit-lens cross-entropy per layer (``lens.logit_lens``: each layer decoded by the
model's own final norm and unembedding) and its drop from the layer before.

Result keys: metrics ``pr``, ``pr_low``, ``pr_high``, ``pr_in_sample``, ``pr_token_id``, ``gain_share``,
``alpha_relative``, ``logit_lens_ce``, ``logit_lens_ce_drop`` (None at the first layer); summary
``pearson_r``, ``decay_ratio``, ``slope_log10`` and their ``_in_sample`` / ``_token_id`` versions,
``pearson_r_low`` / ``_high``, ``slope_log10_low`` / ``_high``.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lens.errors import LensInputError
from probes.prediction_residual import PredictionResidual
from studies.common import StudyConfig, prepare
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "prediction-gains"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``norm``: "auto" (RMSNorm for Llama-style models, LayerNorm otherwise), "rms", "layer" or "none";
    ``split_by``: "auto" (documents when there are at least ``min_docs``, else capture windows), "doc",
    "window"; ``n_boot``: bootstrap replicates over test documents; ``drop_special``: leave BOS/CLS/SEP
    states out (their norms are outliers and they predict nothing); ``logit_lens``: write the
    logit-lens cross-entropy per layer beside PR (loads the model even when a store is reused), on at
    most ``logit_lens_max_tokens`` randomly sampled tokens (0 = all)."""

    site: str = "resid_post"
    norm: str = "auto"
    split_by: str = "auto"
    min_docs: int = 10
    val_fraction: float = 0.2
    test_fraction: float = 0.2
    n_boot: int = 1000
    drop_special: bool = True
    logit_lens: bool = True
    logit_lens_max_tokens: int = 2000


class _LayerView:
    """Lazy (layer, token, d_model) view of a store: one layer is read when indexed."""

    def __init__(self, store, site: str, layers: list[int]):
        self.store, self.site, self.layer_ids = store, site, layers

    def __len__(self) -> int:
        return len(self.layer_ids)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.store.get(layer=self.layer_ids[i], site=self.site)


def resolve_norm(norm: str, family: str) -> str | None:
    if norm == "auto":
        return "rms" if family == "llama" else "layer"
    if norm in ("rms", "layer"):
        return norm
    if norm == "none":
        return None
    raise LensInputError(f"norm: expected auto, rms, layer or none, got {norm!r}")


def split_units(tokens: dict, split_by: str, min_docs: int) -> tuple[np.ndarray, str]:
    """The per-token unit ids the train/validation/test split and the bootstrap use."""
    if split_by not in ("auto", "doc", "window"):
        raise LensInputError(f"split_by: expected auto, doc or window, got {split_by!r}")
    if split_by == "auto":
        split_by = "doc" if len(np.unique(tokens["doc"])) >= min_docs else "window"
    if split_by == "doc":
        return np.asarray(tokens["doc"]), "doc"
    # windows are numbered per document in some stores: make (doc, window) pairs unique
    pairs = np.stack([np.asarray(tokens["doc"]), np.asarray(tokens["window"])], 1)
    return np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1), "window"


def _logit_lens_ce(model, store, site, layers, next_ids, progress, max_tokens: int = 0, seed: int = 0):
    """Logit-lens cross-entropy per layer (``lens.logit_lens``) over (a random sample of) the tokens
    PR is fitted on. Decoding costs tokens × layers × d_model × vocab (35 TFLOP for 20k tokens of
    SmolLM2), so the column uses at most ``max_tokens`` tokens; a mean CE needs far fewer than PR."""
    if model is None:
        return None, "skipped: no model loaded (reusing a store without --param logit_lens=true)"
    if importlib.util.find_spec("lens.logit_lens") is None:
        return None, "skipped: lens.logit_lens not available"
    from lens.logit_lens import logit_lens

    rows = np.flatnonzero(next_ids >= 0)
    if max_tokens and len(rows) > max_tokens:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_tokens, replace=False))
    idx = torch.as_tensor(rows)
    states = {l: store.get(layer=l, site=site)[idx] for l in layers}
    res = logit_lens(model, states, states[layers[-1]], next_ids[rows], progress=progress)
    return np.asarray(res.ce, dtype=np.float64), f"lens.logit_lens on {len(rows)} tokens (final norm + unembedding)"


def figure(layers, pr, lo, hi, ins, tok, summary, title: str):
    import plotly.graph_objects as go

    layers = np.asarray(layers, dtype=float)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=layers, y=pr, mode="markers+lines", name="held-out PR",
                             error_y=dict(type="data", symmetric=False, array=hi - pr, arrayminus=pr - lo)))
    fig.add_trace(go.Scatter(x=layers, y=10 ** (summary.intercept_log10 + summary.slope_log10 * layers),
                             mode="lines", line=dict(dash="dash"),
                             name=f"fit: ρ={summary.decay_ratio:.3f}, r={summary.pearson_r:.3f}"))
    fig.add_trace(go.Scatter(x=layers, y=ins, mode="markers+lines", name="in-sample PR (reference code)",
                             line=dict(dash="dot")))
    fig.add_trace(go.Scatter(x=layers, y=tok, mode="markers+lines", name="token-id target (reference code)",
                             line=dict(dash="dot"), visible="legendonly"))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="prediction residual PR (log scale)",
                      yaxis_type="log", template="plotly_white")
    return fig


def lens_figure(layers, pr, ce, title: str):
    """Held-out PR (log scale, left) and logit-lens cross-entropy (right) against layer."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=layers, y=pr, mode="markers+lines", name="held-out PR"))
    fig.add_trace(go.Scatter(x=layers, y=ce, mode="markers+lines", name="logit-lens cross-entropy (nats)",
                             yaxis="y2"))
    fig.update_layout(title=title, xaxis_title="layer", template="plotly_white",
                      yaxis=dict(title="PR (log scale)", type="log"),
                      yaxis2=dict(title="cross-entropy to the next token", overlaying="y", side="right"))
    return fig


def run(config: Config, out_dir) -> Path:
    t0 = time.time()
    model, store = prepare(config, sites=[config.site], need_model=config.logit_lens)
    family = store.manifest.get("model", {}).get("family", getattr(model, "family", "llama"))
    norm = resolve_norm(config.norm, family)
    if not store.manifest.get("model", {}).get("is_causal", True):
        raise LensInputError(f"{store.model_id} is not a causal language model: next-token prediction "
                             "gains need a decoder")
    layer_ids = list(store.layers(config.site))
    toks = store.tokens
    units, unit_kind = split_units(toks, config.split_by, config.min_docs)
    next_ids = np.asarray(toks["next_token_id"], dtype=np.int64).copy()
    if config.drop_special:
        next_ids[np.asarray(toks["special"], dtype=bool)] = -1      # -1 rows are dropped by the probe
    try:
        est = PredictionResidual(norm=norm, val_fraction=config.val_fraction, test_fraction=config.test_fraction,
                                 n_boot=config.n_boot, seed=config.seed, layers=layer_ids,
                                 progress=config.progress).fit(_LayerView(store, config.site, layer_ids),
                                                               next_ids, units)
    except ValueError as exc:
        raise LensInputError(f"{STUDY}: {exc} (store has {store.n_tokens} tokens in "
                             f"{len(np.unique(units))} {unit_kind}s; raise --max-tokens)") from None
    r = est.result_
    s, si, st = r.summary, r.summary_in_sample, r.summary_token_id
    metrics = {"pr": r.pr, "pr_low": r.pr_low, "pr_high": r.pr_high, "pr_in_sample": r.pr_in_sample,
               "pr_token_id": r.pr_token_id, "gain_share": s.gain_share, "alpha_relative": r.alpha_relative}
    summary = {"pearson_r": s.pearson_r, "decay_ratio": s.decay_ratio, "slope_log10": s.slope_log10,
               "intercept_log10": s.intercept_log10,
               "pearson_r_low": r.pearson_interval[0], "pearson_r_high": r.pearson_interval[1],
               "slope_log10_low": r.slope_interval[0], "slope_log10_high": r.slope_interval[1],
               "pearson_r_in_sample": si.pearson_r, "decay_ratio_in_sample": si.decay_ratio,
               "slope_log10_in_sample": si.slope_log10, "pearson_r_token_id": st.pearson_r,
               "decay_ratio_token_id": st.decay_ratio, "slope_log10_token_id": st.slope_log10,
               "n_train_tokens": int(r.n_tokens[0]), "n_val_tokens": int(r.n_tokens[1]),
               "n_test_tokens": int(r.n_tokens[2]), "split_unit": unit_kind, "norm": str(norm),
               "logit_lens": "not requested"}
    if config.logit_lens:
        ce, how = _logit_lens_ce(model, store, config.site, layer_ids, next_ids, config.progress,
                                 config.logit_lens_max_tokens, config.seed)
        summary["logit_lens"] = how
        if ce is not None:
            metrics["logit_lens_ce"] = ce
            metrics["logit_lens_ce_drop"] = np.concatenate([[np.nan], ce[:-1] - ce[1:]])
            summary["logit_lens_ce_last"] = float(ce[-1])
    title = (f"Prediction residual per layer — {store.model_id}, {int(r.n_tokens.sum())} tokens "
             f"(r={s.pearson_r:.3f}, ρ={s.decay_ratio:.3f})")
    figures = {"main": figure(layer_ids, r.pr, r.pr_low, r.pr_high, r.pr_in_sample, r.pr_token_id, s, title)}
    if "logit_lens_ce" in metrics:
        figures["logit-lens"] = lens_figure(layer_ids, r.pr, metrics["logit_lens_ce"],
                                            f"Prediction residual and logit-lens cross-entropy — {store.model_id}")
    arrays = {"layers": np.asarray(layer_ids), "pr": r.pr, "pr_low": r.pr_low, "pr_high": r.pr_high,
              "pr_in_sample": r.pr_in_sample, "pr_token_id": r.pr_token_id, "val_pr": r.val_pr,
              "alphas_relative": r.alphas_relative, "alpha": r.alpha, "boot_pr": r.boot_pr}
    corpus = store.manifest.get("corpus", {}).get("name", config.corpus)
    return write_result(out_dir, study=STUDY, model=store.model_id, corpus=corpus,
                        n_tokens=int(r.n_tokens.sum()), config=config, layers=layer_ids, metrics=metrics,
                        summary=summary, arrays=arrays, figures=figures, wall_time_s=time.time() - t0)
