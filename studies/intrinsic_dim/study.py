"""Study: intrinsic dimension per layer — of the sequence-level cloud (judged) and of every token (ours) — with
a shuffled-text control.

The judged claim (Cheng et al. 2025; Valeriani et al. 2023: an interior ID peak, a "hunchback") is made on
a cloud of ONE POINT PER SEQUENCE: here one point per capture window, its last token's state (a causal
model: the only token that has read the whole window, as Cheng et al.'s code takes it) or the mean over its
tokens (``pooling``). :mod:`geometry.id_hunchback` gives the statistic — ID at the interior peak layer minus
the higher of the first and last layers', cross-fitted (the peak chosen on half the documents, read on the
other half) — its bootstrap interval over documents, and the permutation null
against the same cloud of the shuffled-text control; nested subsamples of the documents give its stability.

Beside it, ours and not judged (LLM-Microscope measures ID but makes no hunchback claim, and the papers that
do use one point per sequence): the cloud of every token, TwoNN (Facco et al. 2017) and MLE (Levina & Bickel
2005) per layer of ``Config.site`` (``resid_post`` unless told); its interval comes from re-estimating on
random subsets of ``subsample`` tokens (see :mod:`geometry.id_profile`; level ``confidence``). The control
captures the same corpus with the tokens of every document shuffled (Cheng et al. 2025: the ID peak
collapses on shuffled text).

ID estimates depend on how many points they see (the scale they probe; MLE strongly so), so the
headline value and its interval are taken on the same footing: ``twonn`` is the median of the
estimates on ``n_bootstrap`` random subsets of ``subsample`` tokens and ``twonn_low``/``high`` their
percentile interval; ``twonn_all`` is the estimate on all tokens (up to ``sample_tokens``). With
``n_bootstrap=0`` the headline is the all-token estimate and the interval is empty.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import plotly.graph_objects as go

from lens.errors import LensInputError
from studies.core.config import TokenFilterConfig
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.intrinsic_dim.declaration import A, CLAIMS, HEADLINES, M, RESULT, S, _PARTS
import geometry
from studies.core.sampling import window_ids
from geometry.id_hunchback import hunchback, label_permutation_null
from studies.core import stability
from studies.core.sampling import split_units
from lens.text.transforms import parse_transform
from lens.runtime.threads import serial

log = logging.getLogger(__name__)

SHUFFLED = ("shuffled", "shuffle")  # control store name, lens.text.transforms spec


@dataclass(frozen=True)
class Config(TokenFilterConfig):
    """``subsample``: tokens per interval subset (clamped to the token count); ``n_bootstrap``:
    subsets per layer; ``sample_tokens``: cap on tokens for the point estimate (0 = all);
    ``shuffled``: run the shuffled-text control; ``skip_first`` / ``drop_special``: the token filter every
    geometry study shares (:class:`studies.core.config.TokenFilterConfig`; position 0 is an attention sink with massive
    activations; see :func:`lens.store.views.token_mask`)."""

    subsample: int = 2000
    n_bootstrap: int = 10
    confidence: float = 0.9
    # the one fit on all points (``*_all``, a reference line: every headline reads the subsets) is the profile's
    # costliest search (n² per layer): 4000 points cost a sixth of 10,000's. Measured on the main job's store
    # (SmolLM2-135M, 20k tokens; issue #38; the subsets are drawn after this sample, so they are new draws): the
    # headlines TwoNN peak depth 0.655 -> 0.655, TwoNN max 13.39 [13.01, 13.97] -> 13.19 [12.45, 13.97], the
    # sequence-level ones unchanged (0.871 [-3.66, 5.43], depth 0.897); twonn_all itself rises (9.89 -> 11.70 at
    # the peak layer: ID grows at the coarser scale fewer points probe)
    sample_tokens: int = 4_000
    mle_neighbors: int = 20
    twonn_discard_fraction: float = 0.1
    shuffled: bool = True
    chunk_size: int = 2048
    # the sequence-level cloud (the judged claim): one point per window
    sequences: bool = True
    pooling: str = "auto"  # "last" (the window's last kept token), "mean" (over its kept tokens); auto: last if causal
    max_sequences: int = 2000  # windows drawn at most (seeded), for the real text and the control each
    min_sequence_tokens: int = 16  # a window with fewer kept tokens (a document's short tail) is left out
    n_boot: int = 1000  # bootstrap replicates of the sequence-level statistic
    n_perm: int = 99  # relabellings of the permutation null


POOLINGS = ("auto", "last", "mean")


def check(config: Config) -> None:
    if config.pooling not in POOLINGS:
        raise LensInputError(f"pooling: expected one of {', '.join(POOLINGS)}, got {config.pooling!r}")
    for name in ("max_sequences", "n_boot", "n_perm", "min_sequence_tokens"):
        if getattr(config, name) < 0:
            raise LensInputError(f"{name}: expected a number >= 0, got {getattr(config, name)}")


def needs(config: Config) -> Needs:
    return Needs(sites=(config.site,), controls=(SHUFFLED,) if config.shuffled else (),
                 control_tokens=control_tokens(config))


def control_tokens(config: Config) -> int:
    """The shuffled control's token budget: enough for its ``sample_tokens`` points once the mask leaves out
    the special tokens and the positions below ``skip_first`` (a quarter spare, for documents shorter than a
    window), and, with ``sequences``, for ``max_sequences`` whole windows (the same spare), so a store of a
    million tokens does not cost a second capture of a million; 0 (as many as the store) when ``sample_tokens``
    is 0 (every token) or ``max_sequences`` is 0 (every window)."""
    if not config.sample_tokens or (config.sequences and not config.max_sequences):
        return 0
    kept = max(1, config.seq_len - config.skip_first - 1)
    points = int(np.ceil(config.sample_tokens * config.seq_len / kept * 1.25))
    windows = int(np.ceil(config.max_sequences * config.seq_len * 1.25)) if config.sequences else 0
    return max(points, windows)


def _profiles(store, config: Config, label: str) -> dict:
    mask = config.token_mask(store)
    view = store.view(config.site).astype(torch.float32).take(mask)
    n = int(mask.sum())
    sub = max(3, min(config.subsample, n))
    common = dict(layers=view.layers, subsample=sub, n_bootstrap=config.n_bootstrap, confidence=config.confidence,
                  max_points=config.sample_tokens or None, seed=config.seed, progress=config.progress)
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


def sequence_windows(tokens: dict, mask: np.ndarray, min_tokens: int, max_sequences: int, seed: int = 0
                     ) -> list[np.ndarray]:
    """The kept rows (``mask``) of each window that holds at least ``min_tokens`` of them, in position order,
    one array per window; at most ``max_sequences`` windows (0: all), drawn at random (``seed``) when more."""
    rows = np.flatnonzero(mask)
    if not rows.size:
        return []
    wid, pos = window_ids(tokens)[rows], np.asarray(tokens["pos"])[rows]
    order = np.lexsort((pos, wid))
    rows, wid = rows[order], wid[order]
    _, start, count = np.unique(wid, return_index=True, return_counts=True)
    chosen = np.flatnonzero(count >= max(1, min_tokens))
    if max_sequences and chosen.size > max_sequences:
        chosen = np.sort(np.random.default_rng(seed).choice(chosen, size=max_sequences, replace=False))
    return [rows[start[i]: start[i] + count[i]] for i in chosen]


def sequence_cloud(store, config: Config, pooling: str) -> tuple[list, np.ndarray, np.ndarray]:
    """(per-layer ``(window, d_model)`` float32 CPU tensors, the store row that stands for each window, each
    window's kept tokens): one point per window (:func:`sequence_windows`), its last kept token's state
    (``pooling="last"``) or the mean of its kept tokens' (``"mean"``)."""
    mask = config.token_mask(store)
    min_tokens = min(config.min_sequence_tokens, max(1, config.seq_len // 2))
    wins = sequence_windows(store.tokens, mask, min_tokens, config.max_sequences, config.seed)
    if not wins:
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    last, lengths = np.array([w[-1] for w in wins]), np.array([len(w) for w in wins])
    view = store.view(config.site).astype(torch.float32)
    if pooling == "last":
        mats = [X.cpu() for X in view.take(last)]
    else:
        rows = np.concatenate(wins)
        seg = torch.from_numpy(np.repeat(np.arange(len(wins)), [len(w) for w in wins]))
        counts = torch.tensor([len(w) for w in wins], dtype=torch.float32)[:, None]
        mats = [torch.zeros(len(wins), X.shape[1]).index_add_(0, seg, X.cpu()) / counts for X in view.take(rows)]
    return mats, last, lengths


def _sequence_level(config: Config, inputs: Inputs, layers: list) -> tuple[dict, dict, dict, dict]:
    """(metrics, summary, arrays, extra) of the sequence-level cloud (module docstring); empty when it has
    fewer than 4 windows or the site fewer than 3 layers. On one thread: a cloud of a few hundred points is
    thousands of small torch/numpy ops, each of which on a busy machine waits at the pool's barrier (measured
    under load: one layer's TwoNN ratios of 159 points 0.55 s on two threads against 0.02 s on one)."""
    with serial():
        return _sequence_level_serial(config, inputs, layers)


def _sequence_level_serial(config: Config, inputs: Inputs, layers: list) -> tuple[dict, dict, dict, dict]:
    pooling = config.pooling if config.pooling != "auto" else ("last" if inputs.card.is_causal else "mean")
    mats, rows, lengths = sequence_cloud(inputs.store, config, pooling)
    extra = {"seq_pooling": pooling}
    if len(rows) < 4 or len(layers) < 3:
        log.info("sequence-level cloud skipped: %d windows, %d layers", len(rows), len(layers))
        return {}, {}, {}, extra
    units, kind = split_units(inputs.store.tokens)
    units = units[rows]
    frac = config.twonn_discard_fraction
    hb = hunchback(mats, units, n_boot=config.n_boot, level=0.95, discard_fraction=frac, seed=config.seed)
    metrics = {M.seq_twonn: hb.profile, M.seq_twonn_low: hb.low, M.seq_twonn_high: hb.high}
    L = len(layers)
    summary = {S.seq_hunchback: hb.statistic, S.seq_hunchback_low: hb.statistic_low,
               S.seq_hunchback_high: hb.statistic_high, S.seq_hunchback_raw: hb.raw,
               S.seq_peak_layer: int(layers[hb.peak]),
               S.seq_peak_relative_depth: float(hb.peak / (L - 1)), S.seq_peak_support: hb.peak_support,
               S.seq_n_sequences: hb.n_points, S.seq_n_units: hb.n_units, S.seq_units: kind,
               S.seq_pooling: pooling}

    def statistic(m):  # the judged (cross-fitted) statistic on the subsample's own neighbours
        if np.all(m):  # every window: the same ratios and the same seeded splits as hb's, so hb.statistic itself
            return hb.statistic
        keep = torch.from_numpy(np.asarray(m))
        return hunchback([X[keep] for X in mats], units[m], n_boot=0, discard_fraction=frac,
                         seed=config.seed).statistic

    values, _ = stability.nested_values(statistic, units, config.seed)
    tokens = [int(lengths[m].sum()) for m in stability.nested_units(units, config.seed)]  # tokens, not windows
    summary.update(stability.record(S.seq_hunchback, values, tokens))
    arrays = {A.seq_hunchback_replicates: hb.replicates}
    if config.shuffled:
        cmats, crows, _ = sequence_cloud(inputs.controls[SHUFFLED[0]], config, pooling)
        if len(crows) >= 4:
            control = hunchback(cmats, split_units(inputs.controls[SHUFFLED[0]].tokens)[0][crows], n_boot=0,
                                discard_fraction=frac, seed=config.seed)
            metrics[M.seq_twonn_shuffled] = control.profile
            summary[S.seq_n_sequences_shuffled] = len(crows)
            if config.n_perm:
                observed, null = label_permutation_null(mats, cmats, n_perm=config.n_perm, discard_fraction=frac,
                                                        seed=config.seed)
                p = stability.add_one_p(observed, null, greater=True)
                summary.update(stability.null_record(S.seq_hunchback, control.statistic, p))
                arrays[A.seq_null] = null
    log.info("sequence-level ID over %d windows (%s): peak − ends (cross-fitted) = %.2f [%.2f, %.2f]",
             hb.n_points, pooling, hb.statistic, hb.statistic_low, hb.statistic_high)
    return metrics, summary, arrays, extra


def compute(config: Config, inputs: Inputs) -> StudyResult:
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
    if config.sequences:
        seq_metrics, seq_summary, seq_arrays, seq_extra = _sequence_level(config, inputs, layers)
        metrics.update({k: list(map(float, v)) for k, v in seq_metrics.items()})
        summary.update(seq_summary)
        arrays.update(seq_arrays)
    else:
        seq_extra = {}
    if shuffled:
        st = shuffled["twonn"]
        summary[S.twonn_shuffled_max] = float(np.nanmax(headline(st)))
        summary[S.twonn_minus_shuffled_mean] = float(np.nanmean(tw_h - headline(st)))
        arrays[A.twonn_shuffled_replicates] = st.replicates
    return StudyResult(
        model=inputs.store.model_id, corpus=inputs.corpus, n_tokens=real["n"], layers=layers, metrics=metrics,
        summary=summary, arrays=arrays,
        extra={"site": config.site.value, "token_filter": config.token_filter(), "subsample": tw.subsample,
               "confidence": config.confidence,
               "n_tokens_shuffled": shuffled["n"] if shuffled else None,
               "shuffle_transform": parse_transform(SHUFFLED[1]).describe() if shuffled else None, **seq_extra})


def figures(result: StudyResult, config: Config) -> dict:
    fig = go.Figure()
    x = list(result.layers)
    m = result.metrics

    def have(key):
        return key is not None and m.get(key) is not None and len(m[key]) and m[key][0] is not None

    def band(names, name, color, visible=True):
        est, low, high, every = names
        if not have(est):
            return
        if have(low) and have(high):
            fig.add_trace(go.Scatter(x=x + x[::-1], y=list(m[high]) + list(m[low])[::-1], fill="toself",
                                     fillcolor=color.replace("rgb", "rgba").replace(")", ",0.18)"),
                                     line=dict(width=0), hoverinfo="skip", showlegend=False, name=f"{name} interval",
                                     visible=visible))
        fig.add_trace(go.Scatter(x=x, y=list(m[est]), mode="lines+markers", name=name, line=dict(color=color),
                                 visible=visible))
        if have(every) and config.n_bootstrap:
            fig.add_trace(go.Scatter(x=x, y=list(m[every]), mode="lines", name=f"{name} (one fit on all points)",
                                     line=dict(color=color, dash="dot"), visible="legendonly"))

    # the judged cloud first: one point per window (Cheng et al. 2025; Valeriani et al. 2023)
    band((M.seq_twonn, M.seq_twonn_low, M.seq_twonn_high, None), "TwoNN, one point per window (judged)",
         "rgb(148,103,189)")
    band((M.seq_twonn_shuffled, None, None, None), "TwoNN, one point per window, shuffled text", "rgb(140,86,75)")
    band((M.twonn, M.twonn_low, M.twonn_high, M.twonn_all), "TwoNN, every token", "rgb(31,119,180)")
    band((M.mle, M.mle_low, M.mle_high, M.mle_all), "MLE (Levina–Bickel), every token", "rgb(44,160,44)",
         visible="legendonly")
    band((M.twonn_shuffled, M.twonn_shuffled_low, M.twonn_shuffled_high, M.twonn_shuffled_all),
         "TwoNN, every token, shuffled text", "rgb(214,39,40)")
    fig.update_layout(title=f"Intrinsic dimension per layer — {result.model}",
                      xaxis_title=RESULT.axis(result).title,
                      yaxis_title="intrinsic dimension", template="plotly_white", hovermode="x unified")
    return {"main": fig}


STUDY = Study(
    cost=95,
    config=Config, needs=needs, check=check, compute=compute, figures=figures, result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
