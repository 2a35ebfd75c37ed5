"""Study: does the model use its depth? (Csordás, Manning & Potts, NeurIPS 2025), beside He & Su's prediction
gains ("every layer contributes equally").

Per block (:mod:`lens.interventions.depth_use`): the size of its update relative to the residual it reads, for
the whole block and, where the family has ``resid_mid``, its attention and MLP apart ("absent" otherwise); and the
effect of skipping it on every later block's update and on the output cross-entropy.

Text: the token table of ``--store`` when one is given, else the corpus cut into windows as a capture would;
``sample_tokens`` tokens in whole windows drawn at random for the relative updates (one forward pass), and the
first ``skip_tokens`` of those windows for the skip scan (each of the L variants runs the blocks after the one it
skips: about L²/2 block calls, so its sample is the smaller one). Judged: the mean relative update of the second
half's inner blocks over the first half's (declaration), with a document-resampled interval and nested subsamples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens.errors import LensInputError
from studies.core import stability
from studies.core.config import StudyConfig, require_budget
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core.sampling import pick_windows, split_units, window_bounds
from studies.core.stats import group_bootstrap_mean, profile_interval
from studies.depth_use.declaration import A, CLAIMS, HEADLINES, M, RESULT, S
import lens
from lens.interventions.depth_use import depth_use_scan
from lens.runtime.precision import resolve_precision, forward_precision
from lens.text.corpora import make_windows


@dataclass(frozen=True)
class Config(StudyConfig):
    """``sample_tokens``: tokens (whole windows drawn at random) the relative updates average over (0 = all);
    ``skip_tokens``: tokens of those windows the skip scan runs on (0 = no skip scan); ``n_boot``: resamples of
    documents (or windows) for the intervals; ``precision`` of the forward passes: "float32" (default: a skip's
    change of a later update is read against float32 rounding), "auto" or "bfloat16"
    (:func:`lens.runtime.precision.matmul_precision`)."""

    sample_tokens: int = 1280  # 10 windows of 128: the fewest units a resampled interval may rest on (MIN_UNITS)
    skip_tokens: int = 128
    n_boot: int = 1000
    precision: str = "float32"


def check(config: Config) -> None:
    require_budget("depth-use", "sample_tokens", config.sample_tokens)
    require_budget("depth-use", "skip_tokens", config.skip_tokens)
    if config.n_boot < 1:
        raise LensInputError(f"n_boot: expected at least 1 resample, got {config.n_boot}")
    resolve_precision(config.precision, config.device)


def needs(config: Config) -> Needs:
    return Needs(model=True, lm_head=True, causal=True, tokens=True)


def text_windows(config: Config, inputs: Inputs):
    """(windows of token ids, next-token targets, each window's document) from the store's token table or the
    corpus, cut as a capture cuts it."""
    if inputs.store is not None:
        tok = inputs.store.tokens
        ids, nt, doc = np.asarray(tok["token_id"]), np.asarray(tok["next_token_id"]), np.asarray(tok["doc"])
        bounds = list(zip(*window_bounds(tok)))
        return [ids[a:b] for a, b in bounds], [nt[a:b] for a, b in bounds], np.array([doc[a] for a, _ in bounds])
    w = make_windows(lens.load_corpus(config.corpus), inputs.model.tokenizer, seq_len=config.seq_len,
                     max_tokens=config.max_tokens, is_causal=inputs.card.is_causal, sample=config.sample,
                     sample_seed=config.sample_seed)
    off = w.window_offsets()
    nt, doc = w.rows["next_token_id"], np.asarray(w.rows["doc"])
    return (list(w.input_ids), [nt[off[i]:off[i + 1]] for i in range(w.n_windows)],
            np.array([doc[off[i]] for i in range(w.n_windows)]))


def halves(n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks over blocks 0..L-1: the first and the second half's inner blocks (1..L-2, split at L/2)."""
    layers = np.arange(n_layers)
    inner = (layers >= 1) & (layers <= n_layers - 2)
    return inner & (layers < n_layers / 2), inner & (layers >= n_layers / 2)


def half_ratio(profile, n_layers: int) -> float | None:
    """Mean of ``profile`` over the second half's inner blocks / over the first half's (None when undefined)."""
    first, second = halves(n_layers)
    p = np.asarray(profile, float)
    a, b = p[first], p[second]
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if not a.size or not b.size or a.mean() <= 0:
        return None
    return float(b.mean() / a.mean())


def _mean(values, mask) -> float | None:
    v = np.asarray(values, float)[mask]
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else None


def judged_stats(rel: np.ndarray, units: np.ndarray, n_boot: int, seed: int) -> dict:
    """The judged ratio of the halves' mean relative updates (``rel``: layer, token), its interval resampling
    ``units`` (one per token) and its value on nested subsamples of them."""
    L = rel.shape[0]
    value = half_ratio(rel.mean(1), L)
    lo, hi = profile_interval(lambda p: half_ratio(p, L), [rel], units, n_boot, seed)

    def stat(mask):
        if not mask.any():
            raise ValueError("empty subsample")
        return half_ratio(rel[:, mask].mean(1), L)

    values, _ = stability.nested_values(stat, units, seed)
    tokens = [int(m.sum()) for m in stability.nested_units(units, seed)]
    return {S.second_half_ratio: value, S.second_half_ratio_low: lo, S.second_half_ratio_high: hi,
            **stability.record(S.second_half_ratio, values, tokens)}


def compute(config: Config, inputs: Inputs) -> StudyResult:
    model = inputs.model
    windows, targets, window_doc = text_windows(config, inputs)
    chosen = pick_windows([len(w) for w in windows], config.sample_tokens, config.seed)
    if chosen is not None:
        windows, targets, window_doc = [windows[i] for i in chosen], [targets[i] for i in chosen], window_doc[chosen]
    if not windows:
        raise LensInputError("no text: expected at least one window (raise --max-tokens)")
    n_skip = 0
    if config.skip_tokens:  # the first windows of the (randomly drawn) sample, until skip_tokens
        n_skip = int(np.searchsorted(np.cumsum([len(w) for w in windows]), config.skip_tokens) + 1)
    with forward_precision(config.precision, model):
        r = depth_use_scan(model, windows, targets, batch_size=config.batch_size, skip=False,
                           progress=config.progress)
        s = (depth_use_scan(model, windows[:n_skip], targets[:n_skip], batch_size=config.batch_size, skip=True,
                            progress=config.progress) if n_skip else None)
    L = model.n_layers
    units, unit_kind = split_units({"doc": window_doc[r.token_window], "window": r.token_window})
    first, second = halves(L)
    metrics = {M.rel_contribution: r.rel_layer.mean(1)}
    lo, hi = group_bootstrap_mean(r.rel_layer, units, config.n_boot, config.seed)  # per layer, units resampled
    metrics[M.rel_contribution_low], metrics[M.rel_contribution_high] = lo.tolist(), hi.tolist()
    if r.rel_attn is not None:
        metrics[M.rel_attn], metrics[M.rel_mlp] = r.rel_attn.mean(1), r.rel_mlp.mean(1)
    summary = {**judged_stats(r.rel_layer, units, config.n_boot, config.seed),
               S.parts: "present" if not r.parts_absent else r.parts_absent,
               S.n_tokens_updates: int(r.rel_layer.shape[1]), S.units: unit_kind,
               S.n_units: int(len(np.unique(units))),
               S.halves: f"first: blocks {np.flatnonzero(first).min()}..{np.flatnonzero(first).max()}, second: "
                         f"blocks {np.flatnonzero(second).min()}..{np.flatnonzero(second).max()} (of 0..{L - 1})"
               if first.any() and second.any() else "fewer than 4 blocks: no inner halves"}
    arrays = {A.layers: np.arange(L)}
    if s is not None:
        with np.errstate(invalid="ignore"):
            future = np.array([np.nanmean(row) if np.isfinite(row).any() else np.nan for row in s.skip_effect])
        metrics[M.skip_future_effect], metrics[M.skip_delta_ce] = future, s.skip_delta_ce
        has_later = np.isfinite(future)
        summary.update({S.skip_effect_half_ratio: half_ratio(np.where(has_later, future, np.nan), L),
                        S.skip_delta_ce_first_half: _mean(s.skip_delta_ce, first),
                        S.skip_delta_ce_second_half: _mean(s.skip_delta_ce, second),
                        S.base_ce: s.base_ce, S.n_tokens_skip: int(s.window_n_tokens.sum()),
                        S.replayed: s.replayed})
        arrays[A.skip_effect] = s.skip_effect
    return StudyResult(model=inputs.card.model_id, corpus=inputs.corpus, n_tokens=int(r.rel_layer.shape[1]),
                       layers=list(range(L)), metrics=metrics, summary=summary, arrays=arrays,
                       extra={"skip": "block l's input passed on as its output at every position of the window",
                              "rel": "per token ||h_{l+1} - h_l|| / ||h_l||, h_l the input of block l, every "
                                     "position of each window (the first one included, as the reference code)"})


def figures(result: StudyResult, config: Config) -> dict:
    m, s, x = result.metrics, result.summary, list(result.layers)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("relative update ‖Δ‖ / ‖h‖ per block",
                                                        "block l skipped: later updates and output"))
    rel = np.asarray(m[M.rel_contribution], float)
    lo = np.asarray([np.nan if v is None else v for v in m[M.rel_contribution_low]], float)
    hi = np.asarray([np.nan if v is None else v for v in m[M.rel_contribution_high]], float)
    fig.add_trace(go.Scatter(x=x, y=rel, mode="lines+markers", name="attention + MLP",
                             error_y=dict(type="data", symmetric=False, array=hi - rel, arrayminus=rel - lo)), 1, 1)
    for key, name in ((M.rel_attn, "attention"), (M.rel_mlp, "MLP")):
        if key in m:
            fig.add_trace(go.Scatter(x=x, y=m[key], mode="lines", name=name, line=dict(dash="dot")), 1, 1)
    for key, name in ((M.skip_future_effect, "change of later blocks' updates"),
                      (M.skip_delta_ce, "Δ cross-entropy (nats/token)")):
        if key in m:
            fig.add_trace(go.Scatter(x=x, y=m[key], mode="lines+markers", name=name), 1, 2)
    fig.update_xaxes(title_text="block l")
    fig.update_yaxes(type="log", title_text="relative update ‖Δ‖ / ‖h‖", row=1, col=1)
    fig.update_yaxes(title_text="relative change / Δ CE (nats/token)", row=1, col=2)
    ratio = s.get(S.second_half_ratio)
    fig.update_layout(title=f"Depth use — {result.model}: second half / first half = "
                            f"{'n/a' if ratio is None else f'{ratio:.2f}'}", template="plotly_white")
    figs = {"main": fig}
    if A.skip_effect in result.arrays:
        heat = go.Figure(go.Heatmap(z=np.asarray(result.arrays[A.skip_effect], float), x=x, y=x,
                                    colorbar=dict(title="relative change")))
        heat.update_layout(title="Block l skipped (row): relative change of block k's update (column)",
                           xaxis_title="block k (effect)", yaxis_title="block l (skipped)", template="plotly_white")
        figs["skip-effects"] = heat
    return figs


STUDY = Study(
    cost=25,
    needs_all_positions="it re-runs the store's windows, rebuilt from its token table",
    config=Config, check=check, needs=needs, compute=compute, figures=figures, result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
