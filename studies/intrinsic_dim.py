"""Study: intrinsic dimension of the token point cloud per layer, with a shuffled-text control.

TwoNN (Facco et al. 2017) and MLE (Levina & Bickel 2005) per layer of ``Config.site`` (``resid_post``
unless told); the TwoNN interval comes from re-estimating on random subsets of ``subsample`` tokens (see
:mod:`geometry.id_profile`). The control captures the same corpus with the tokens of every
document shuffled: "geometry of token point clouds" and LLM-Microscope find that the ID of real
text peaks at mid depth and tracks the loss, which shuffled text should not reproduce.

ID estimates depend on how many points they see (the scale they probe; MLE strongly so), so the
headline value and its interval are taken on the same footing: ``twonn`` is the median of the
estimates on ``n_bootstrap`` random subsets of ``subsample`` tokens and ``twonn_low``/``high`` their
percentile interval; ``twonn_all`` is the estimate on all tokens (up to ``max_points``). With
``n_bootstrap=0`` the headline is the all-token estimate and the interval is empty.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from studies.config import SiteConfig
from studies.contract import Inputs, Needs, Study, StudyResult
from studies.declarations.intrinsic_dim import A, CLAIMS, HEADLINES, M, RESULT, S, _PARTS

log = logging.getLogger(__name__)

SHUFFLED = ("shuffled", "shuffle")  # control store name, lens.text.transforms spec


@dataclass(frozen=True)
class Config(SiteConfig):
    """``subsample``: tokens per interval subset (clamped to the token count); ``n_bootstrap``:
    subsets per layer; ``max_points``: cap on tokens for the point estimate (0 = all);
    ``shuffled``: run the shuffled-text control; ``drop_special``: leave BOS/CLS/SEP out;
    ``min_pos``: leave out window positions below it (position 0 is an attention sink with massive
    activations; see :func:`lens.store.views.token_mask`)."""

    subsample: int = 2000
    n_bootstrap: int = 10
    confidence: float = 0.9
    max_points: int = 10_000
    mle_neighbors: int = 20
    twonn_discard_fraction: float = 0.1
    shuffled: bool = True
    drop_special: bool = True
    min_pos: int = 1
    chunk_size: int = 2048


def needs(config: Config) -> Needs:
    return Needs(sites=(config.site,), controls=(SHUFFLED,) if config.shuffled else (),
                 control_tokens=control_tokens(config))


def control_tokens(config: Config) -> int:
    """The shuffled control's token budget: enough for its ``max_points`` points once the mask leaves out
    the special tokens and the positions below ``min_pos`` (a quarter spare, for documents shorter than a
    window), so a store of a million tokens does not cost a second capture of a million; 0 (as many as
    the store) when ``max_points`` is 0 (every token)."""
    if not config.max_points:
        return 0
    kept = max(1, config.seq_len - config.min_pos - 1)
    return int(np.ceil(config.max_points * config.seq_len / kept * 1.25))


def _profiles(store, config: Config, label: str) -> dict:
    import geometry

    mask = store.mask(config.drop_special, config.min_pos)
    view = store.view(config.site).astype(torch.float32).take(mask)
    n = int(mask.sum())
    sub = max(3, min(config.subsample, n))
    common = dict(layers=view.layers, subsample=sub, n_bootstrap=config.n_bootstrap, confidence=config.confidence,
                  max_points=config.max_points or None, seed=config.seed, progress=config.progress)
    device = None if config.device == "cpu" else config.device
    estimators = {"twonn": geometry.TwoNN(discard_fraction=config.twonn_discard_fraction,
                                          chunk_size=config.chunk_size, device=device)}
    if label == "real":
        estimators["mle"] = geometry.MLE(n_neighbors=config.mle_neighbors, chunk_size=config.chunk_size,
                                         device=device)
    # one neighbour graph per point set (layer × subset) serves both estimators
    # the view itself: each layer is read in turn, and only the rows the fits draw (geometry.id_profile)
    res = geometry.intrinsic_dims_by_layer(view, estimators, **common)
    log.info("%s: ID profile over %d tokens, %d layers", label, n, len(view.layers))
    return {"layers": view.layers, "n": n, "twonn": res["twonn"], "mle": res.get("mle")}


def headline(res) -> np.ndarray:
    """The subsample median when there are subsets, else the all-token estimate (see module docstring)."""
    return res.dimension_boot if res.replicates.shape[1] else res.dimension


def compute(config: Config, inputs: Inputs) -> StudyResult:
    from lens.text.transforms import parse_transform

    real = _profiles(inputs.store, config, "real")
    shuffled = _profiles(inputs.controls[SHUFFLED[0]], config, "shuffled") if config.shuffled else None
    layers = real["layers"]
    tw, ml = real["twonn"], real["mle"]
    metrics = {}
    for key, res in ((M.twonn, tw), (M.mle, ml), (M.twonn_shuffled, shuffled["twonn"] if shuffled else None)):
        values = (headline(res), res.low, res.high, res.dimension) if res is not None else (None,) * 4
        for part, v in zip(_PARTS, values):
            metrics[key + part] = [None] * len(layers) if v is None else v
    tw_h, ml_h = headline(tw), headline(ml)
    peak = int(np.nanargmax(tw_h))
    summary = {
        S.twonn_max: float(np.nanmax(tw_h)), S.twonn_peak_layer: int(layers[peak]),
        S.twonn_peak_relative_depth: float(peak / max(1, len(layers) - 1)),
        S.mle_max: float(np.nanmax(ml_h)), S.mle_peak_layer: int(layers[int(np.nanargmax(ml_h))]),
        S.n_duplicates_max: int(tw.n_duplicates.max()),
    }
    arrays = {A.layers: np.asarray(layers), A.twonn_replicates: tw.replicates, A.mle_replicates: ml.replicates,
              A.n_duplicates: tw.n_duplicates}
    if shuffled:
        st = shuffled["twonn"]
        summary[S.twonn_shuffled_max] = float(np.nanmax(headline(st)))
        summary[S.twonn_minus_shuffled_mean] = float(np.nanmean(tw_h - headline(st)))
        arrays[A.twonn_shuffled_replicates] = st.replicates
    return StudyResult(
        model=inputs.store.model_id, corpus=inputs.corpus, n_tokens=real["n"], layers=layers, metrics=metrics,
        summary=summary, arrays=arrays,
        extra={"site": config.site.value, "subsample": tw.subsample, "confidence": config.confidence,
               "n_tokens_shuffled": shuffled["n"] if shuffled else None,
               "shuffle_transform": parse_transform(SHUFFLED[1]).describe() if shuffled else None})


def figures(result: StudyResult, config: Config) -> dict:
    import plotly.graph_objects as go

    fig = go.Figure()
    x = list(result.layers)
    m = result.metrics

    def band(names, name, color):
        est, low, high, every = names
        if m[est][0] is None:
            return
        fig.add_trace(go.Scatter(x=x + x[::-1], y=list(m[high]) + list(m[low])[::-1],
                                 fill="toself", fillcolor=color.replace("rgb", "rgba").replace(")", ",0.18)"),
                                 line=dict(width=0), hoverinfo="skip", showlegend=False, name=f"{name} interval"))
        fig.add_trace(go.Scatter(x=x, y=list(m[est]), mode="lines+markers", name=name, line=dict(color=color)))
        if config.n_bootstrap:
            fig.add_trace(go.Scatter(x=x, y=list(m[every]), mode="lines", name=f"{name}, all tokens",
                                     line=dict(color=color, dash="dot"), visible="legendonly"))

    band((M.twonn, M.twonn_low, M.twonn_high, M.twonn_all), "TwoNN", "rgb(31,119,180)")
    band((M.mle, M.mle_low, M.mle_high, M.mle_all), "MLE (Levina–Bickel)", "rgb(44,160,44)")
    band((M.twonn_shuffled, M.twonn_shuffled_low, M.twonn_shuffled_high, M.twonn_shuffled_all),
         "TwoNN, shuffled text", "rgb(214,39,40)")
    fig.update_layout(title=f"Intrinsic dimension per layer — {result.model}",
                      xaxis_title=f"layer ({result.extra['site']})",
                      yaxis_title="intrinsic dimension", template="plotly_white", hovermode="x unified")
    return {"main": fig}


STUDY = Study(
    cost=95,
    config=Config, needs=needs, compute=compute, figures=figures, result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
