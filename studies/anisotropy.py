"""Study: anisotropy, rogue dimensions and positional outlier neurons per layer, under post-processing.

Per ``resid_post`` layer (special tokens left out): mean cosine of token pairs, top-PC variance share,
self-similarity of word types (token ids) across contexts, intra-sentence similarity (a context =
one capture window), maximum explainable variance — raw and baseline-adjusted (Ethayarajh 2019;
baselines in :mod:`geometry.anisotropy`); rogue dimensions by contribution to the mean cosine
(Timkey & van Schijndel 2021); outlier neurons and their correlation with position. Every metric is
recomputed under each post-processing in ``Config.postprocessing`` (standardise, ZCA-whiten, remove
the top-k rogue dimensions, clip) and stored as ``<metric>__<postprocessing>``.

Result metrics (raw): ``mean_cosine``, ``top_pc_share``, ``self_similarity``,
``intra_sentence_similarity``, ``mev``, their ``*_adjusted`` versions, ``rogue_share`` (share of the
mean cosine carried by the top ``k_rogue`` = 3 dimensions), ``rogue_dims`` (their indices, a list
per layer), ``n_outlier_dims``, ``outlier_position_corr`` and ``position0_norm_ratio`` (mean norm
of the left-out first-position tokens over the others: the size of the attention-sink activations).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

import geometry
from studies.common import StudyConfig, prepare
from studies.geometry_support import finite_or_none, layer_states, position_norm_ratio, token_mask
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "anisotropy"
SCALARS = ("mean_cosine", "top_pc_share", "top_pc_share_adjusted", "self_similarity", "self_similarity_adjusted",
           "intra_sentence_similarity", "intra_sentence_similarity_adjusted", "mev", "mev_adjusted", "rogue_share")
PANELS = (("mean_cosine", None), ("top_pc_share", "top_pc_share_adjusted"),
          ("self_similarity", "self_similarity_adjusted"),
          ("intra_sentence_similarity", "intra_sentence_similarity_adjusted"), ("mev", "mev_adjusted"),
          ("rogue_share", None))


@dataclass(frozen=True)
class Config(StudyConfig):
    """``postprocessing``: names from ``geometry.POSTPROCESSING`` ("raw" is always computed);
    ``k_rogue``: rogue dimensions reported (and removed by "remove_top"); ``min_count``: occurrences a
    word type needs for self-similarity / MEV; ``max_words``: word types sampled for MEV;
    ``outlier_z``: z-score over dimensions that makes a dimension an outlier; ``drop_special`` /
    ``min_pos``: leave out special tokens / window positions below ``min_pos`` (the first position's
    massive activations; their size is reported as ``position0_norm_ratio``)."""

    postprocessing: tuple = ("standardize", "whiten", "remove_top", "clip")
    k_rogue: int = 3
    min_count: int = 5
    max_words: int = 300
    outlier_z: float = 3.0
    drop_special: bool = True
    min_pos: int = 1


def figures(layers, profiles: dict, outliers, model: str) -> dict:
    raw = profiles["raw"]
    x = list(layers)
    main = make_subplots(rows=2, cols=3, subplot_titles=[p[0].replace("_", " ") for p in PANELS])
    for i, (name, adj) in enumerate(PANELS):
        r, c = divmod(i, 3)
        main.add_trace(go.Scatter(x=x, y=getattr(raw, name), mode="lines+markers", name=name,
                                  line=dict(color="rgb(31,119,180)"), showlegend=i == 0, legendgroup="raw"),
                       row=r + 1, col=c + 1)
        if adj:
            main.add_trace(go.Scatter(x=x, y=getattr(raw, adj), mode="lines+markers", name="baseline-adjusted",
                                      line=dict(color="rgb(255,127,14)", dash="dash"), showlegend=i == 1,
                                      legendgroup="adj"), row=r + 1, col=c + 1)
    main.update_layout(title=f"Anisotropy per layer — {model} (blue raw, orange baseline-adjusted)",
                       template="plotly_white", height=650)
    main.update_xaxes(title_text="layer")

    post = make_subplots(rows=1, cols=3, subplot_titles=["mean cosine", "self-similarity (adjusted)",
                                                        "top-PC share (adjusted)"])
    for j, (pp, prof) in enumerate(profiles.items()):
        for c, name in enumerate(("mean_cosine", "self_similarity_adjusted", "top_pc_share_adjusted")):
            post.add_trace(go.Scatter(x=x, y=getattr(prof, name), mode="lines+markers", name=pp, legendgroup=pp,
                                      showlegend=c == 0, line=dict(color=_COLORS[j % len(_COLORS)])),
                           row=1, col=c + 1)
    post.update_layout(title=f"Anisotropy under post-processing — {model}", template="plotly_white")
    post.update_xaxes(title_text="layer")

    rogue = go.Figure()
    for rank in range(raw.rogue_dims.shape[1]):
        share = raw.cosine_contributions[np.arange(len(x)), raw.rogue_dims[:, rank]] / raw.mean_cosine
        rogue.add_trace(go.Bar(x=x, y=share, name=f"rank {rank + 1}", text=[f"d{d}" for d in raw.rogue_dims[:, rank]],
                               textposition="inside"))
    rogue.update_layout(barmode="stack", template="plotly_white", xaxis_title="layer",
                        yaxis_title="share of mean cosine",
                        title=f"Rogue dimensions: top contributors to the mean cosine — {model}")

    dims = np.argsort(-outliers.magnitude_z.max(axis=0))[:12]
    heat = go.Figure(go.Heatmap(z=outliers.magnitude_z[:, dims].T, x=x, y=[f"d{d}" for d in dims],
                                colorscale="Viridis", colorbar=dict(title="z of mean |x|"),
                                customdata=outliers.position_corr[:, dims].T,
                                hovertemplate="layer %{x}, %{y}: z=%{z:.1f}, corr(position)=%{customdata:.2f}"))
    heat.update_layout(title=f"Outlier dimensions (magnitude z-score across dimensions) — {model}",
                       xaxis_title="layer", template="plotly_white")
    return {"main": main, "postprocessing": post, "rogue": rogue, "outliers": heat}


_COLORS = ("rgb(31,119,180)", "rgb(255,127,14)", "rgb(44,160,44)", "rgb(214,39,40)", "rgb(148,103,189)",
           "rgb(140,86,75)")


def run(config: Config, out_dir) -> Path:
    """Capture (or reuse) ``resid_post`` states, compute every measure per layer, write the results folder."""
    t0 = time.time()
    unknown = [p for p in config.postprocessing if p not in geometry.POSTPROCESSING]
    if unknown:
        from lens.errors import LensInputError

        raise LensInputError(f"unknown post-processing {unknown}; expected names from {geometry.POSTPROCESSING}")
    _, store = prepare(config, sites=["resid_post"])
    mask = token_mask(store, config.drop_special, config.min_pos)
    layers, mats = layer_states(store, "resid_post", mask)
    words = np.asarray(store.tokens["token_id"])[mask]
    contexts = np.asarray(store.tokens["window"])[mask]
    positions = np.asarray(store.tokens["pos"])[mask]
    profiles = {}
    for pp in ("raw",) + tuple(p for p in config.postprocessing if p != "raw"):
        profiles[pp] = geometry.anisotropy_by_layer(
            mats, layers=layers, words=words, sentences=contexts, postprocessing=pp, k_rogue=config.k_rogue,
            min_count=config.min_count, max_words=config.max_words, seed=config.seed, progress=config.progress)
    outliers = geometry.outlier_neurons(mats, positions, layers=layers, z_threshold=config.outlier_z)

    raw = profiles["raw"]
    metrics = {name: finite_or_none(getattr(raw, name)) for name in SCALARS}
    metrics["rogue_dims"] = raw.rogue_dims.tolist()
    metrics["position0_norm_ratio"] = position_norm_ratio(store, "resid_post", config.drop_special,
                                                          max(1, config.min_pos))
    metrics["n_outlier_dims"] = outliers.is_outlier.sum(axis=1).tolist()
    abs_corr = np.where(outliers.is_outlier, np.abs(np.nan_to_num(outliers.position_corr)), np.nan)
    with np.errstate(all="ignore"):
        metrics["outlier_position_corr"] = finite_or_none(
            [np.nanmax(row) if np.isfinite(row).any() else np.nan for row in abs_corr])
    for pp, prof in profiles.items():
        if pp != "raw":
            for name in SCALARS:
                metrics[f"{name}__{pp}"] = finite_or_none(getattr(prof, name))
    top = int(np.nanargmax(raw.mean_cosine))
    summary = {
        "max_mean_cosine": float(np.nanmax(raw.mean_cosine)), "max_mean_cosine_layer": int(layers[top]),
        "mean_rogue_share": float(np.nanmean(raw.rogue_share)),
        "persistent_outlier_dims": outliers.persistent_dims.tolist(),
        "persistent_outlier_position_corr": outliers.persistent_position_corr.tolist(),
    }
    for pp, prof in profiles.items():
        summary[f"mean_cosine_mean__{pp}"] = float(np.nanmean(prof.mean_cosine))
    arrays = {
        "layers": np.asarray(layers), "rogue_dims": raw.rogue_dims, "cosine_contributions": raw.cosine_contributions,
        "outlier_magnitude_z": outliers.magnitude_z, "outlier_position_corr": outliers.position_corr,
        "outlier_extreme_share": outliers.extreme_share, "persistent_outlier_dims": outliers.persistent_dims,
    }
    return write_result(
        out_dir, study=STUDY, model=config.model, corpus=config.corpus, n_tokens=int(mask.sum()), config=config,
        layers=layers, metrics=metrics, summary=summary, arrays=arrays,
        figures=figures(layers, profiles, outliers, config.model), wall_time_s=time.time() - t0,
        extra={"site": "resid_post", "postprocessing": list(profiles), "word_label": "token_id",
               "context_label": "window", "metric_suffix": "<metric>__<postprocessing>"},
    )
