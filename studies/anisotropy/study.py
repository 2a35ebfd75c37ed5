"""Study: anisotropy, rogue dimensions and positional outlier neurons per layer, under post-processing.

Per layer of ``Config.site`` (``resid_post`` unless told; special tokens left out): mean cosine of token
pairs, top-PC variance share, self-similarity of word types (token ids) across contexts, intra-sentence
similarity (a context = one capture window), maximum explainable variance — raw and baseline-adjusted
(Ethayarajh 2019; baselines in :mod:`geometry.anisotropy`); rogue dimensions by contribution to the mean cosine
(Timkey & van Schijndel 2021); outlier neurons and their correlation with position. Every metric is
recomputed under each post-processing in ``Config.postprocessing`` (standardise, ZCA-whiten, remove
the top-k rogue dimensions, clip) and stored as ``<metric>__<postprocessing>``.

The judged claim (Ethayarajh 2019: anisotropic in every non-input layer) is the mean cosine of random pairs
against the isotropic null (:func:`isotropy_judgement`, :mod:`geometry.nulls`): per layer, its
document-bootstrap interval and the null's 97.5% quantile at the same number of tokens; judged, the lowest
excess over layers, with nested-subsample values and an add-one p-value. The same pass gives each layer's
participation ratio, plain and corrected for the number of tokens (:mod:`geometry.participation`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens.errors import LensInputError
from lens.sites import DEFAULT_SITE
from studies.core.config import TokenFilterConfig
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core import stability
from studies.core.sampling import sample_mask, split_units
from studies.anisotropy.declaration import A, CLAIMS, HEADLINES, KEY, M, RESULT, S, _SCALARS
import geometry
from geometry import nulls
from geometry.participation import participation_ratios
from geometry.sinks import massive_activations
from lens.capturing.attention_sinks import first_position_attention

RAW = "raw"
_PANELS = ((M.mean_cosine, None), (M.top_pc_share, M.top_pc_share_adjusted),
           (M.self_similarity, M.self_similarity_adjusted),
           (M.intra_sentence_similarity, M.intra_sentence_similarity_adjusted), (M.mev, M.mev_adjusted),
           (M.mev_centred, M.mev_centred_adjusted), (M.rogue_share, None))
_PANEL_COLS = 4
_COLORS = ("rgb(31,119,180)", "rgb(255,127,14)", "rgb(44,160,44)", "rgb(214,39,40)", "rgb(148,103,189)",
           "rgb(140,86,75)")


@dataclass(frozen=True)
class Config(TokenFilterConfig):
    """``postprocessing``: names from ``geometry.POSTPROCESSING`` ("raw" is always computed);
    ``k_rogue``: rogue dimensions reported (and removed by "remove_top"); ``min_count``: occurrences a
    word type needs for self-similarity / MEV; ``max_words``: word types sampled for MEV;
    ``max_occurrences``: occurrences of a word type MEV reads (a seeded random choice of them when it has
    more: a frequent token's thousands would cost a Gram matrix of that size per layer, per
    post-processing and per baseline; 0 = all);
    ``outlier_z``: z-score over dimensions that makes a dimension an outlier; ``skip_first`` / ``drop_special``:
    the token filter every geometry study shares (:class:`studies.core.config.TokenFilterConfig`: the first
    positions' massive activations are left out; their size is reported as ``position0_norm_ratio`` and in the
    sink table); ``sink_tokens``: tokens, whole windows at every position (the first included) drawn at random,
    the sink table reads (0 = no table); ``sink_attention_tokens``: tokens of those windows the model is run on for
    the share of attention each head gives the first position (0 = not measured; needs the model with eager
    attention, else said absent); ``sample_tokens``:
    above this many analysed tokens, whole windows drawn at random (``seed``) up to it are analysed —
    one layer of the sample in float32 at a time — and the result's ``extra["sample"]`` says so; the
    norm ratio always reads every token, in chunks (0 = no sampling)."""

    postprocessing: tuple = ("standardize", "whiten", "remove_top", "clip")
    k_rogue: int = 3
    min_count: int = 5
    max_words: int = 300
    max_occurrences: int = 256
    outlier_z: float = 3.0
    sample_tokens: int = 2500
    sink_tokens: int = 4096
    sink_attention_tokens: int = 512
    null_draws: int = 999
    n_boot: int = 1000
    null_quantile: float = 0.975


def check(config: Config) -> None:
    unknown = [p for p in config.postprocessing if p not in geometry.POSTPROCESSING]
    if unknown:
        raise LensInputError(f"unknown post-processing {unknown}; expected names from {geometry.POSTPROCESSING}")
    if config.null_draws < 19 or config.n_boot < 2:
        raise LensInputError(f"null_draws must be at least 19 and n_boot at least 2; got {config.null_draws}, "
                             f"{config.n_boot}")
    if not 0.5 < config.null_quantile < 1:
        raise LensInputError(f"null_quantile must lie in (0.5, 1); got {config.null_quantile}")
    if config.max_occurrences == 1 or config.max_occurrences < 0:
        raise LensInputError(f"max_occurrences must be 0 (every occurrence) or at least 2; got {config.max_occurrences}")


def needs(config: Config) -> Needs:
    return Needs(sites=(config.site,), model=config.sink_attention_tokens > 0)


def _norm_ratio(X: torch.Tensor, early: torch.Tensor, late: torch.Tensor) -> float:
    norms = torch.linalg.vector_norm(X, dim=1).cpu()
    return float(norms[early].mean() / norms[late].mean())


def position_norm_ratio(store, drop_special: bool = True, min_pos: int = 1, site=DEFAULT_SITE) -> list:
    """Per layer of ``site``: mean state norm of the (non-special) tokens at positions < ``min_pos`` divided
    by that of the others — how massive the excluded first-position activations are (None if none)."""
    base = store.mask(drop_special, 0)
    pos = np.asarray(store.tokens["pos"])
    early, late = torch.from_numpy(base & (pos < min_pos)), torch.from_numpy(base & (pos >= min_pos))
    view = store.view(site).astype(torch.float32)
    if not bool(early.any()) or not bool(late.any()):
        return [None] * len(view)
    return [_norm_ratio(X, early, late) for X in view]


NORM_CHUNK_BYTES = 1 << 28  # float32 bytes of one chunk of rows read for the norm ratio


def _norms(store, layer: int, rows: np.ndarray, site=DEFAULT_SITE) -> torch.Tensor:
    """Float32 norms of ``rows`` of one layer of ``site``, read a chunk of rows at a time (the values
    equal those of the whole layer read at once)."""
    step = max(1, NORM_CHUNK_BYTES // (4 * store.d_model))
    if len(rows) == store.n_tokens and len(rows) <= step:
        return torch.linalg.vector_norm(store.get(site, layer, dtype=torch.float32), dim=1).cpu()
    return torch.cat([torch.linalg.vector_norm(store.get(site, layer, dtype=torch.float32,
                                                         rows=rows[i:i + step]), dim=1).cpu()
                      for i in range(0, len(rows), step)])


def _norm_ratios(store, drop_special: bool, min_pos: int, layers, site=DEFAULT_SITE) -> list:
    """Per layer :func:`position_norm_ratio` at ``max(1, min_pos)``, streaming (no layer held whole)."""
    base = store.mask(drop_special, 0)
    pos = np.asarray(store.tokens["pos"])
    cut = max(1, min_pos)
    early, late = base & (pos < cut), base & (pos >= cut)
    if not early.any() or not late.any():
        return [None] * len(layers)
    rows = np.flatnonzero(base)
    e, l = torch.from_numpy(early[rows]), torch.from_numpy(late[rows])
    out = []
    for layer in layers:
        norms = _norms(store, layer, rows, site)
        out.append(float(norms[e].mean() / norms[l].mean()))
    return out


def isotropy_judgement(mats, layers, units: np.ndarray, config: Config) -> tuple[dict, dict]:
    """The claim's numbers (Ethayarajh 2019: anisotropic in every layer), from one more pass over the layers:
    per layer the mean cosine of random pairs with its document-bootstrap interval, the isotropic null's
    ``null_quantile`` quantile at the same number of tokens (:mod:`geometry.nulls`), and the participation
    ratio plain and corrected (:mod:`geometry.participation`); the judged value — the lowest excess of the
    mean cosine over the null's quantile — with its interval, its value on nested subsamples of the units
    and its add-one p-value against the same statistic on the null's draws. (metrics, summary)."""
    uniq, inv = np.unique(units, return_inverse=True)
    sums, draws, mc, pr, prc = [], [], [], [], []
    for i in range(len(mats)):
        X = mats[i]
        S_g, m, var = nulls.unit_sums(X, inv)
        sums.append(S_g)
        draws.append(nulls.isotropic_null_draws(var, config.null_draws, seed=config.seed + i))
        mc.append(nulls.mean_cosine_of(S_g, m))
        plain, corr = participation_ratios(X)
        pr.append(plain)
        prc.append(corr)
        del X
    n = float(m.sum())
    qs = config.null_quantile
    quant = lambda d, size: float(np.quantile(nulls.null_mean_cosine(d, size), qs))  # noqa: E731
    q = np.array([quant(d, n) for d in draws])
    excess = np.asarray(mc) - q
    low = high = [None] * len(mats)
    ex_low = ex_high = None
    if len(uniq) >= 2:
        W = nulls.bootstrap_weights(len(uniq), config.n_boot, config.seed)
        boot = np.stack([nulls.bootstrap_mean_cosine(S_g, m, W) for S_g in sums])  # [layer, replicate]
        ivs = [nulls.percentile_interval(b) for b in boot]
        low, high = [v[0] for v in ivs], [v[1] for v in ivs]
        ex_low, ex_high = nulls.percentile_interval((boot - q[:, None]).min(axis=0))
    null_ex = np.stack([nulls.null_mean_cosine(d, n) for d in draws]) - q[:, None]  # [layer, draw]
    null_min = null_ex.min(axis=0)
    value = float(excess.min())

    def nested(mask: np.ndarray) -> float:
        sel = np.zeros(len(uniq), bool)
        sel[np.unique(inv[mask])] = True
        size = float(m[sel].sum())
        if size < 2:
            raise ValueError("too few tokens")
        return min(nulls.mean_cosine_of(S_g[sel], m[sel]) - quant(d, size) for S_g, d in zip(sums, draws))

    values, sizes = stability.nested_values(nested, inv, config.seed)
    metrics = {M.mean_cosine_low: low, M.mean_cosine_high: high, M.mean_cosine_null_quantile: q.tolist(),
               M.participation_ratio: pr, M.participation_ratio_corrected: prc}
    summary = {S.mean_cosine_excess_min: value, S.mean_cosine_excess_low: ex_low, S.mean_cosine_excess_high: ex_high,
               S.mean_cosine_excess_min_layer: int(layers[int(np.argmin(excess))]),
               S.n_units: int(len(uniq)),
               **stability.record(KEY, values, sizes),
               **stability.null_record(KEY, float(null_min.mean()), stability.add_one_p(value, null_min))}
    return metrics, summary


def sink_table(config: Config, inputs: Inputs, layers) -> tuple[dict, dict, dict]:
    """(metrics, summary, arrays) of the sinks: per layer the largest channels with their max / median magnitude
    (:func:`geometry.sinks.massive_activations`, every position of ``sink_tokens`` tokens in whole windows, the first
    position included — the token filter is what leaves it out elsewhere) and the share of attention each head
    gives the first position (:func:`lens.capturing.attention_sinks.first_position_attention`, on the first
    windows of that sample holding ``sink_attention_tokens``; absent, with why, where the model returns no
    attention weights)."""
    store = inputs.store
    if not config.sink_tokens:
        return {}, {S.sink_attention: "not requested (sink_tokens=0)"}, {}
    rows, _ = sample_mask(store, False, 0, config.sink_tokens, config.seed)
    rows = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows)
    view = store.view(config.site).astype(torch.float32).take(rows)
    pos = np.asarray(store.tokens["pos"])[rows]
    ma = massive_activations([view[i] for i in range(len(layers))], pos)
    metrics = {M.sink_top_ratio: ma.ratio[:, 0], M.sink_top_channel: ma.channel[:, 0].tolist(),
               M.sink_top_first_share: ma.first_share[:, 0]}
    top = int(np.nanargmax(ma.ratio[:, 0]))
    summary = {S.sink_tokens: int(len(rows)), S.sink_top_ratio_max: float(ma.ratio[top, 0]),
               S.sink_top_ratio_layer: int(layers[top]), S.sink_top_ratio_channel: int(ma.channel[top, 0])}
    arrays = {A.sink_channels: ma.channel, A.sink_max_abs: ma.max_abs, A.sink_ratio: ma.ratio,
              A.sink_position: ma.position, A.sink_first_share: ma.first_share, A.sink_median_abs: ma.median_abs}
    model = inputs.model
    if not config.sink_attention_tokens or model is None:
        summary[S.sink_attention] = "not requested (sink_attention_tokens=0)"
        return metrics, summary, arrays
    win = np.asarray(store.tokens["window"])[rows]
    doc = np.asarray(store.tokens["doc"])[rows]
    ids = np.asarray(store.tokens["token_id"])[rows]
    starts = np.r_[0, np.flatnonzero((win[1:] != win[:-1]) | (doc[1:] != doc[:-1])) + 1, len(rows)]
    windows, n = [], 0
    for a, b in zip(starts[:-1], starts[1:]):
        if n >= config.sink_attention_tokens:
            break
        if pos[a] == 0:  # a whole window from its start: position 0 is the window's first token
            windows.append(ids[a:b])
            n += b - a
    att = first_position_attention(model, windows, batch_size=config.batch_size)
    if att.share is None or len(att.share) != len(layers):
        summary[S.sink_attention] = att.absent or "absent: the attention shares do not cover the store's layers"
        return metrics, summary, arrays
    metrics[M.first_position_attention] = att.per_layer
    arrays[A.first_position_attention_heads] = att.share
    summary[S.sink_attention] = f"present: {att.n_queries} query positions of {len(windows)} windows"
    return metrics, summary, arrays


def compute(config: Config, inputs: Inputs) -> StudyResult:
    store = inputs.store
    rows, drawn = sample_mask(store, config.drop_special, config.skip_first, config.sample_tokens, config.seed)
    # a lazy view: each pass below reads one layer of the analysed rows at a time (never all layers)
    mats = store.view(config.site).astype(torch.float32).take(rows)
    layers = mats.layers
    norm_ratio = _norm_ratios(store, config.drop_special, config.skip_first, layers, config.site)
    words = np.asarray(store.tokens["token_id"])[rows]
    contexts = np.asarray(store.tokens["window"])[rows]
    positions = np.asarray(store.tokens["pos"])[rows]
    # every post-processing of a layer from one moments pass and one metrics pass (geometry.moments)
    profiles = geometry.anisotropy_profiles(
        mats, (RAW,) + tuple(p for p in config.postprocessing if p != RAW), layers=layers, words=words,
        sentences=contexts, k_rogue=config.k_rogue, min_count=config.min_count, max_words=config.max_words,
        max_occurrences=config.max_occurrences or None,
        seed=config.seed, progress=config.progress)
    outliers = geometry.outlier_neurons(mats, positions, layers=layers, z_threshold=config.outlier_z)
    units, unit_kind = split_units(store.tokens)
    iso_metrics, iso_summary = isotropy_judgement(mats, layers, np.asarray(units)[rows], config)

    raw = profiles[RAW]
    metrics = {name: getattr(raw, name) for name in _SCALARS}
    metrics[M.rogue_dims] = raw.rogue_dims.tolist()
    metrics[M.position0_norm_ratio] = norm_ratio
    metrics[M.n_outlier_dims] = outliers.is_outlier.sum(axis=1).tolist()
    abs_corr = np.where(outliers.is_outlier, np.abs(np.nan_to_num(outliers.position_corr)), np.nan)
    with np.errstate(all="ignore"):
        metrics[M.outlier_position_corr] = [np.nanmax(row) if np.isfinite(row).any() else np.nan for row in abs_corr]
    for pp, prof in profiles.items():
        if pp != RAW:
            for name in _SCALARS:
                metrics[M.postprocessed(name, pp)] = getattr(prof, name)
    top = int(np.nanargmax(raw.mean_cosine))
    summary = {
        S.max_mean_cosine: float(np.nanmax(raw.mean_cosine)), S.max_mean_cosine_layer: int(layers[top]),
        S.mean_rogue_share: float(np.nanmean(raw.rogue_share)),
        S.persistent_outlier_dims: outliers.persistent_dims.tolist(),
        S.persistent_outlier_position_corr: outliers.persistent_position_corr.tolist(),
    }
    for pp, prof in profiles.items():
        summary[S.mean_cosine_mean(pp)] = float(np.nanmean(prof.mean_cosine))
    metrics.update(iso_metrics)
    summary.update(iso_summary)
    summary[S.bootstrap_unit] = unit_kind
    sink_metrics, sink_summary, sink_arrays = sink_table(config, inputs, layers)
    metrics.update(sink_metrics)
    summary.update(sink_summary)
    arrays = {
        A.layers: np.asarray(layers), A.rogue_dims: raw.rogue_dims, A.cosine_contributions: raw.cosine_contributions,
        A.outlier_magnitude_z: outliers.magnitude_z, A.outlier_position_corr: outliers.position_corr,
        A.outlier_extreme_share: outliers.extreme_share, A.persistent_outlier_dims: outliers.persistent_dims,
        **sink_arrays,
    }
    return StudyResult(
        model=store.model_id, corpus=inputs.corpus, n_tokens=int(len(rows)), layers=layers, metrics=metrics,
        summary=summary, arrays=arrays,
        extra={"site": config.site.value, "postprocessing": list(profiles), "word_label": "token_id",
               "context_label": "window", "metric_suffix": "<metric>__<postprocessing>", "sample": drawn,
               "token_filter": config.token_filter()})


def _main_figure(result: StudyResult):
    """The per-layer panels (raw and baseline-adjusted) and, when the claim was judged, its interval panel."""
    m, model = result.metrics, result.model
    x = list(result.layers)
    judged = M.mean_cosine_null_quantile in m
    titles = [p[0].replace("_", " ") for p in _PANELS] + (["mean cosine: 95% interval vs isotropic null"] if judged else [])
    main = make_subplots(rows=-(-len(titles) // _PANEL_COLS), cols=_PANEL_COLS, subplot_titles=titles)
    for i, (name, adj) in enumerate(_PANELS):
        r, c = divmod(i, _PANEL_COLS)
        main.add_trace(go.Scatter(x=x, y=m[name], mode="lines+markers", name=name,
                                  line=dict(color="rgb(31,119,180)"), showlegend=i == 0, legendgroup="raw"),
                       row=r + 1, col=c + 1)
        if adj:
            main.add_trace(go.Scatter(x=x, y=m[adj], mode="lines+markers", name="baseline-adjusted",
                                      line=dict(color="rgb(255,127,14)", dash="dash"), showlegend=i == 1,
                                      legendgroup="adj"), row=r + 1, col=c + 1)
        main.update_yaxes(title_text=RESULT.unit(name), row=r + 1, col=c + 1)  # the panel's title names the metric
    if judged:  # the claim's panel: the mean cosine's interval above the null's upper quantile in every layer
        r, c = divmod(len(_PANELS), _PANEL_COLS)
        lo, hi = m[M.mean_cosine_low], m[M.mean_cosine_high]
        main.add_trace(go.Scatter(x=x + x[::-1], y=list(hi) + list(lo)[::-1], fill="toself", mode="none",
                                  fillcolor="rgba(31,119,180,0.25)", name="mean cosine, 95% interval"),
                       row=r + 1, col=c + 1)
        main.add_trace(go.Scatter(x=x, y=m[M.mean_cosine], mode="lines+markers", line=dict(color="rgb(31,119,180)"),
                                  showlegend=False), row=r + 1, col=c + 1)
        main.add_trace(go.Scatter(x=x, y=m[M.mean_cosine_null_quantile], mode="lines", name="isotropic null, 97.5%",
                                  line=dict(color="rgb(127,127,127)", dash="dot")), row=r + 1, col=c + 1)
        main.update_yaxes(title_text=RESULT.unit(M.mean_cosine), row=r + 1, col=c + 1)
    main.update_layout(title=f"Anisotropy per layer — {model} (blue raw, orange baseline-adjusted)",
                       template="plotly_white", height=650)
    main.update_xaxes(title_text=RESULT.axis(result).title)
    return main


def figures(result: StudyResult, config: Config) -> dict:
    m, a, model = result.metrics, result.arrays, result.model
    x = list(result.layers)
    main = _main_figure(result)

    post = make_subplots(rows=1, cols=3, subplot_titles=["mean cosine", "self-similarity (adjusted)",
                                                        "top-PC share (adjusted)"])
    shown = (M.mean_cosine, M.self_similarity_adjusted, M.top_pc_share_adjusted)
    for j, pp in enumerate(result.extra["postprocessing"]):
        for c, name in enumerate(shown):
            y = m[name] if pp == RAW else m[M.postprocessed(name, pp)]
            post.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=pp, legendgroup=pp, showlegend=c == 0,
                                      line=dict(color=_COLORS[j % len(_COLORS)])), row=1, col=c + 1)
    post.update_layout(title=f"Anisotropy under post-processing — {model}", template="plotly_white")
    post.update_xaxes(title_text=RESULT.axis(result).title)
    for c, name in enumerate(shown):
        post.update_yaxes(title_text=RESULT.unit(name), row=1, col=c + 1)

    rogue = go.Figure()
    dims, contrib = a[A.rogue_dims], a[A.cosine_contributions]
    for rank in range(dims.shape[1]):
        share = contrib[np.arange(len(x)), dims[:, rank]] / np.asarray(m[M.mean_cosine], float)
        rogue.add_trace(go.Bar(x=x, y=share, name=f"rank {rank + 1}", text=[f"d{d}" for d in dims[:, rank]],
                               textposition="inside"))
    rogue.update_layout(barmode="stack", template="plotly_white", xaxis_title=RESULT.axis(result).title,
                        yaxis_title="share of mean cosine",
                        title=f"Rogue dimensions: top contributors to the mean cosine — {model}")

    z, corr = a[A.outlier_magnitude_z], a[A.outlier_position_corr]
    top = np.argsort(-z.max(axis=0))[:12]
    heat = go.Figure(go.Heatmap(z=z[:, top].T, x=x, y=[f"d{d}" for d in top], colorscale="Viridis",
                                colorbar=dict(title="z of mean |x|"), customdata=corr[:, top].T,
                                hovertemplate="layer %{x}, %{y}: z=%{z:.1f}, corr(position)=%{customdata:.2f}"))
    heat.update_layout(title=f"Outlier dimensions (magnitude z-score across dimensions) — {model}",
                       xaxis_title=RESULT.axis(result).title, yaxis_title="dimension (the 12 with the largest z)", template="plotly_white")
    out = {"main": main, "postprocessing": post, "rogue": rogue, "outliers": heat}
    if M.participation_ratio in m:
        pr = go.Figure()
        pr.add_trace(go.Scatter(x=x, y=m[M.participation_ratio], mode="lines+markers", name="plain (biased low at small n)"))
        pr.add_trace(go.Scatter(x=x, y=m[M.participation_ratio_corrected], mode="lines+markers",
                                name="corrected for n (Chun et al.)", line=dict(dash="dash")))
        pr.update_layout(title=f"Participation ratio (Σλ)²/Σλ² per layer — {model}", xaxis_title=RESULT.axis(result).title,
                         yaxis_title="dimensions", yaxis_type="log", template="plotly_white")
        out["participation"] = pr
    if M.sink_top_ratio in m:  # the sink table: massive activations and attention to the first position
        sink = make_subplots(rows=1, cols=2, subplot_titles=("largest channel's max |x| / median |x|",
                                                             "attention to the first position"))
        sink.add_trace(go.Scatter(x=x, y=m[M.sink_top_ratio], mode="lines+markers", name="max / median |x|",
                                  text=[f"channel {c}" for c in m[M.sink_top_channel]]), 1, 1)
        if M.first_position_attention in m:
            sink.add_trace(go.Scatter(x=x, y=m[M.first_position_attention], mode="lines+markers",
                                      name="share of attention on position 0 (mean over heads)"), 1, 2)
        sink.update_yaxes(title_text="ratio", type="log", row=1, col=1)
        sink.update_yaxes(title_text="share of attention (0–1)", row=1, col=2)
        sink.update_xaxes(title_text=RESULT.axis(result).title)
        sink.update_layout(title=f"Attention sinks and massive activations — {model} "
                                 f"({result.summary.get(S.sink_attention, '')})", template="plotly_white")
        out["sinks"] = sink
    return out


STUDY = Study(
    cost=45,  # 2500 sampled tokens (issue #38; 70 s at every token of a 20000-token store)
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
