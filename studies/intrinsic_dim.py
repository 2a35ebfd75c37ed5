"""Study: intrinsic dimension of the token point cloud per layer, with a shuffled-text control.

TwoNN (Facco et al. 2017) and MLE (Levina & Bickel 2005) per ``resid_post`` layer; the TwoNN
interval comes from re-estimating on random subsets of ``subsample`` tokens (see
:mod:`geometry.id_profile`). The control captures the same corpus with the tokens of every
document shuffled: "geometry of token point clouds" and LLM-Microscope find that the ID of real
text peaks at mid depth and tracks the loss, which shuffled text should not reproduce.

Result metrics (one entry per layer): ``twonn``, ``twonn_low``, ``twonn_high``, ``mle``,
``mle_low``, ``mle_high``, ``twonn_shuffled``, ``twonn_shuffled_low``, ``twonn_shuffled_high``,
and ``twonn_all`` / ``mle_all`` / ``twonn_shuffled_all``.

ID estimates depend on how many points they see (the scale they probe; MLE strongly so), so the
headline value and its interval are taken on the same footing: ``twonn`` is the median of the
estimates on ``n_bootstrap`` random subsets of ``subsample`` tokens and ``twonn_low``/``high`` their
percentile interval; ``twonn_all`` is the estimate on all tokens (up to ``max_points``). With
``n_bootstrap=0`` the headline is the all-token estimate and the interval is empty.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

import geometry
from studies.common import StudyConfig, prepare
from studies.geometry_support import finite_or_none, layer_states, shuffle_transform, token_mask
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "intrinsic-dim"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``subsample``: tokens per interval subset (clamped to the token count); ``n_bootstrap``:
    subsets per layer; ``max_points``: cap on tokens for the point estimate (0 = all);
    ``shuffled``: run the shuffled-text control; ``drop_special``: leave BOS/CLS/SEP out;
    ``min_pos``: leave out window positions below it (position 0 is an attention sink with massive
    activations; see ``studies.geometry_support.token_mask``)."""

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


def _profiles(store, config: Config, label: str) -> dict:
    mask = token_mask(store, config.drop_special, config.min_pos)
    layers, mats = layer_states(store, "resid_post", mask)
    n = int(mask.sum())
    sub = max(3, min(config.subsample, n))
    common = dict(layers=layers, subsample=sub, n_bootstrap=config.n_bootstrap, confidence=config.confidence,
                  max_points=config.max_points or None, seed=config.seed, progress=config.progress)
    device = None if config.device == "cpu" else config.device
    twonn = geometry.intrinsic_dim_by_layer(
        mats, geometry.TwoNN(discard_fraction=config.twonn_discard_fraction, chunk_size=config.chunk_size,
                             device=device), **common)
    mle = None
    if label == "real":
        mle = geometry.intrinsic_dim_by_layer(
            mats, geometry.MLE(n_neighbors=config.mle_neighbors, chunk_size=config.chunk_size, device=device),
            **common)
    log.info("%s: ID profile over %d tokens, %d layers", label, n, len(layers))
    return {"layers": layers, "n": n, "twonn": twonn, "mle": mle}


def headline(res) -> np.ndarray:
    """The subsample median when there are subsets, else the all-token estimate (see module docstring)."""
    return res.dimension_boot if res.replicates.shape[1] else res.dimension


def figure(layers, real: dict, shuffled: dict | None, model: str) -> go.Figure:
    fig = go.Figure()
    x = list(layers)

    def band(res, name, color):
        fig.add_trace(go.Scatter(x=x + x[::-1], y=list(res.high) + list(res.low)[::-1], fill="toself",
                                 fillcolor=color.replace("rgb", "rgba").replace(")", ",0.18)"),
                                 line=dict(width=0), hoverinfo="skip", showlegend=False, name=f"{name} interval"))
        fig.add_trace(go.Scatter(x=x, y=list(headline(res)), mode="lines+markers", name=name,
                                 line=dict(color=color)))
        if res.replicates.shape[1]:
            fig.add_trace(go.Scatter(x=x, y=list(res.dimension), mode="lines", name=f"{name}, all tokens",
                                     line=dict(color=color, dash="dot"), visible="legendonly"))

    band(real["twonn"], "TwoNN", "rgb(31,119,180)")
    band(real["mle"], "MLE (Levina–Bickel)", "rgb(44,160,44)")
    if shuffled is not None:
        band(shuffled["twonn"], "TwoNN, shuffled text", "rgb(214,39,40)")
    fig.update_layout(title=f"Intrinsic dimension per layer — {model}", xaxis_title="layer (resid_post)",
                      yaxis_title="intrinsic dimension", template="plotly_white", hovermode="x unified")
    return fig


def run(config: Config, out_dir) -> Path:
    """Capture (or reuse) ``resid_post`` states, estimate ID per layer, write the results folder."""
    t0 = time.time()
    _, store = prepare(config, sites=["resid_post"])
    real = _profiles(store, config, "real")
    shuffled = None
    if config.shuffled:
        shuffled_path = None if config.store is None else f"{str(config.store).rstrip('/')}-shuffled"
        _, sstore = prepare(config, sites=["resid_post"], transform=shuffle_transform(), store_path=shuffled_path)
        shuffled = _profiles(sstore, config, "shuffled")
    layers = real["layers"]
    tw, ml = real["twonn"], real["mle"]
    metrics = {}
    for key, res in (("twonn", tw), ("mle", ml), ("twonn_shuffled", shuffled["twonn"] if shuffled else None)):
        if res is None:
            for suffix in ("", "_low", "_high", "_all"):
                metrics[key + suffix] = [None] * len(layers)
            continue
        metrics[key] = finite_or_none(headline(res))
        metrics[key + "_low"] = finite_or_none(res.low)
        metrics[key + "_high"] = finite_or_none(res.high)
        metrics[key + "_all"] = finite_or_none(res.dimension)
    tw_h, ml_h = headline(tw), headline(ml)
    peak = int(np.nanargmax(tw_h))
    summary = {
        "twonn_max": float(np.nanmax(tw_h)), "twonn_peak_layer": int(layers[peak]),
        "twonn_peak_relative_depth": float(peak / max(1, len(layers) - 1)),
        "mle_max": float(np.nanmax(ml_h)), "mle_peak_layer": int(layers[int(np.nanargmax(ml_h))]),
        "n_duplicates_max": int(tw.n_duplicates.max()),
    }
    arrays = {"layers": np.asarray(layers), "twonn_replicates": tw.replicates, "mle_replicates": ml.replicates,
              "n_duplicates": tw.n_duplicates}
    if shuffled:
        st = shuffled["twonn"]
        summary["twonn_shuffled_max"] = float(np.nanmax(headline(st)))
        summary["twonn_minus_shuffled_mean"] = float(np.nanmean(tw_h - headline(st)))
        arrays["twonn_shuffled_replicates"] = st.replicates
    return write_result(
        out_dir, study=STUDY, model=config.model, corpus=config.corpus, n_tokens=real["n"], config=config,
        layers=layers, metrics=metrics, summary=summary, arrays=arrays,
        figures={"main": figure(layers, real, shuffled, config.model)}, wall_time_s=time.time() - t0,
        extra={"site": "resid_post", "subsample": tw.subsample, "confidence": config.confidence,
               "n_tokens_shuffled": shuffled["n"] if shuffled else None,
               "shuffle_transform": shuffle_transform().describe() if shuffled else None},
    )
