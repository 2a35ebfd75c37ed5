"""Study: the logit lens of every layer (nostalgebraist 2020) on ``Config.site`` (``resid_post`` unless told;
and ``resid_mid``).

Each layer's state is decoded through the model's own final norm and unembedding
(:mod:`lens.readout.logit_lens`), on ``sample_tokens`` tokens in whole windows drawn at random from the store
(0 = every token). ``resid_mid`` is decoded too where the model's family has that site (its card
says; parallel and recurrent blocks have none, ``resid_mid`` in the summary says why). ``ce_low`` /
``ce_high``: 95% interval of ``ce`` with documents resampled (windows when the sample has fewer
than 10 documents; ``bootstrap_unit`` says which). ``last_layer_max_abs_logit_diff`` compares the
lens of the last layer with the model's logits on the first windows, re-run. ``uniform_ce`` = ln V and
``n_layers_worse_than_uniform``: where the lens predicts worse than knowing nothing; ``late_drop_share``: the
share of the CE's fall made after mid depth, with a 95% interval over the same units and nested values — judged
only where the lens beats uniform on at least half the layers (else the tuned lens's profile is judged).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import plotly.graph_objects as go

from lens.sites import OUTPUT_SITE
from studies.core import stability
from studies.core.config import SiteConfig, require_budget
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core.sampling import sample_windows, split_units
from studies.core.stats import group_bootstrap_mean, profile_interval
from studies.logit_lens.declaration import A, CLAIMS, HEADLINES, M, RESULT, S, late_drop_share
from lens.text.corpora import token_strings
from lens.readout.logit_lens import decode_precision, last_layer_logit_check
from lens.readout.store_lens import store_logit_lens
from lens.readout.jacobian_lens import jacobian_lens_metrics, load_lens


@dataclass(frozen=True)
class Config(SiteConfig):
    """``chunk_size``: tokens decoded at once (memory ≈ a few × chunk_size × d_vocab floats);
    ``top_k``: tokens kept per state for the explorer, for the first ``topk_tokens`` tokens;
    ``resid_mid``: also decode the states after attention (where the family has them);
    ``check_windows``: windows re-run to compare the last layer's lens with the model's logits;
    ``sample_tokens``: tokens decoded, whole windows drawn at random from the store (0 = every token) —
    decoding costs tokens × layers × d_model × d_vocab (35 TFLOP for 20k tokens of SmolLM2, twice with
    ``resid_mid``), while the per-layer means settle long before: their bootstrap intervals are in
    the result; ``heatmap_positions``: tokens of the first window in the main figure; ``grid_top_k``: top-k kept
    per layer for each of the first ``grid_tokens`` decoded tokens (0 = every one), compactly (token-id
    texts once, probabilities as float16), for the explorer's token × layer grid — 0 keeps none;
    ``jacobian_lens``: a Jacobian lens file (``lens jlens fit``, :mod:`lens.readout.jacobian_lens`) decoded on the
    same tokens beside the logit lens, and offered by the grid ("" = none)."""

    chunk_size: int = 512
    sample_tokens: int = 4096
    top_k: int = 10
    topk_tokens: int = 256
    resid_mid: bool = True
    drop_special: bool = True
    check_windows: int = 2
    heatmap_positions: int = 48
    grid_top_k: int = 5
    grid_tokens: int = 0
    jacobian_lens: str = ""


def check(config: Config) -> None:
    require_budget("logit-lens", "sample_tokens", config.sample_tokens)


def needs(config: Config) -> Needs:
    return Needs(sites=tuple(dict.fromkeys((config.site, OUTPUT_SITE))),
                 optional_sites=("resid_mid",) if config.resid_mid else (),
                 model=True, lm_head=True)


def by_position(token_ce: np.ndarray, pos: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean CE per (layer, position in window) over the ``keep`` tokens."""
    P = int(pos.max()) + 1 if pos.size else 0
    sums = np.zeros((token_ce.shape[0], P))
    count = np.bincount(pos[keep], minlength=P)
    for i in range(token_ce.shape[0]):
        sums[i] = np.bincount(pos[keep], weights=token_ce[i, keep], minlength=P)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sums / count).astype(np.float32), count


def masked_profile(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per-layer mean of ``values`` (layer, token; NaN = not scored) over the tokens in ``mask``."""
    sub = np.asarray(values, dtype=np.float64)[:, mask]
    if not np.isfinite(sub).any():
        raise ValueError("no scored token in the subsample")
    with np.errstate(invalid="ignore"):
        return np.nanmean(sub, axis=1)


def id_strings(tokenizer, ids: np.ndarray) -> np.ndarray:
    """Token text for an int array of any shape (decoded once per distinct id)."""
    ids = np.asarray(ids)
    if ids.size == 0:
        return np.zeros(ids.shape, dtype=str)
    return token_strings(tokenizer, ids.ravel()).reshape(ids.shape)


def grid_arrays(tokenizer, res, mid, n_grid: int, k: int, jac=None) -> dict:
    """The explorer grid's arrays: per-token entropy (and KL for ``resid_mid``), and the top-``k`` of
    the first ``n_grid`` decoded tokens at every layer as indices into one table of token texts, with
    float16 probabilities (a tenth of the size of texts per cell)."""
    lenses = [(res, A.grid_topk, A.grid_topk_probs)]
    if mid is not None:
        lenses.append((mid, A.mid_grid_topk, A.mid_grid_topk_probs))
    if jac is not None:
        lenses.append((jac, A.jacobian_grid_topk, A.jacobian_grid_topk_probs))
    vocab = np.unique(np.concatenate([r.topk_ids[:, :n_grid, :k].ravel() for r, _, _ in lenses]))
    index_dtype = np.uint16 if vocab.size <= np.iinfo(np.uint16).max else np.int32
    out = {A.token_entropy: res.token_entropy, A.grid_vocab: id_strings(tokenizer, vocab)}
    for r, top, probs in lenses:
        out[top] = np.searchsorted(vocab, r.topk_ids[:, :n_grid, :k]).astype(index_dtype)
        out[probs] = r.topk_probs[:, :n_grid, :k].astype(np.float16)
    if mid is not None:
        out.update({A.mid_token_kl: mid.token_kl, A.mid_token_entropy: mid.token_entropy})
    if jac is not None:
        out.update({A.jacobian_token_kl: jac.token_kl, A.jacobian_token_entropy: jac.token_entropy})
    return out


def jacobian_decode(config, model, store, rows, nt, mask, n_grid: int):
    """The Jacobian lens of ``config.jacobian_lens`` on the decoded rows (None when not asked)."""
    if not config.jacobian_lens:
        return None

    L = model.n_layers
    jl = load_lens(config.jacobian_lens, model)
    jl.check_model(model, config.site)
    view = store.view(config.site, layers=range(L)).astype(torch.float32)
    states = (view if rows is None else view.take(rows)).lazy()
    fview = view if config.site == OUTPUT_SITE else store.view(OUTPUT_SITE, layers=[L - 1]).astype(torch.float32)
    final = (fview if rows is None else fview.take(rows)).lazy()[L - 1]
    return jacobian_lens_metrics(model, jl, states, final, nt, config.site, mask=mask,
                                 top_k=max(1, config.grid_top_k), topk_rows=np.arange(n_grid) if n_grid else None,
                                 chunk_size=config.chunk_size, progress=config.progress)


def compute(config: Config, inputs: Inputs) -> StudyResult:
    model, store = inputs.model, inputs.store
    L = inputs.card.n_layers
    rows = sample_windows(store.tokens, config.sample_tokens, config.seed)
    sel = slice(None) if rows is None else rows
    tok = {c: np.asarray(v)[sel] for c, v in store.tokens.items()}
    nt = tok["next_token_id"]
    mask = store.mask(config.drop_special)[sel]
    # decoded through lens.readout.store_lens: rows another study decoded in this process (prediction gains'
    # logit-lens column, in a main job) are not decoded again
    topk_rows = np.arange(min(config.topk_tokens, len(nt)))
    # the explorer's grid wants the top-k of every decoded token: one decode gives both (the first
    # topk_tokens rows and top_k slots are the arrays saved before the grid existed)
    n_grid = 0 if config.grid_top_k <= 0 else len(nt) if config.grid_tokens <= 0 else min(config.grid_tokens, len(nt))
    asked = np.arange(max(n_grid, topk_rows.size))
    top_k = max(config.top_k, config.grid_top_k if n_grid else 0)
    res = store_logit_lens(model, store, rows, site=config.site, mask=mask, topk_rows=asked, top_k=top_k,
                           chunk_size=config.chunk_size, progress=config.progress)
    check = list(dict.fromkeys(tok["window"].tolist()))[: config.check_windows]  # as last_layer_logit_check picks
    check_rows = np.flatnonzero(np.isin(tok["window"], check))
    final = store.view(OUTPUT_SITE, layers=[L - 1]).astype(torch.float32).take(
        check_rows if rows is None else rows[check_rows]).at(L - 1)
    diff, logit_scale = last_layer_logit_check(model, final, tok["token_id"][check_rows], tok["window"][check_rows],
                                               max_windows=config.check_windows)
    mid = None
    if "resid_mid" in inputs.sites:
        mid = store_logit_lens(model, store, rows, site="resid_mid", mask=mask, top_k=max(1, config.grid_top_k),
                               topk_rows=np.arange(n_grid) if n_grid else None, chunk_size=config.chunk_size,
                               progress=config.progress)
    jac = jacobian_decode(config, model, store, rows, nt, mask, n_grid)
    layers = res.layers.tolist()
    ce_pos, pos_count = by_position(np.nan_to_num(res.token_ce), np.asarray(tok["pos"]), mask & (nt >= 0))

    # resample documents when there are enough of them, else windows (as prediction-gains splits)
    groups, unit = split_units(tok, "auto", 10)
    scored = np.where(mask[None, :], res.token_ce, np.nan)
    ce_low, ce_high = group_bootstrap_mean(scored, groups, seed=config.seed)
    # the depth profile's late share (studies.logit_lens.declaration): its interval resamples the same units, its
    # nested values (studies.core.stability) recompute it on a quarter and a half of them
    share_low, share_high = profile_interval(late_drop_share, [scored], groups, seed=config.seed)
    nested, nested_n = stability.nested_values(lambda m: late_drop_share(masked_profile(scored, m)), groups,
                                               seed=config.seed)
    d_vocab = getattr(model, "d_vocab", None)
    uniform_ce = float(np.log(d_vocab)) if d_vocab else None
    metrics = {M.ce: res.ce, M.ce_low: ce_low, M.ce_high: ce_high, M.kl_to_final: res.kl_to_final,
               M.top1_agreement: res.top1_agreement, M.top1_accuracy: res.top1_accuracy, M.entropy: res.entropy,
               M.median_rank: res.median_rank, M.mean_rank: res.mean_rank}
    if mid is not None:
        metrics.update({M.mid_ce: mid.ce, M.mid_kl_to_final: mid.kl_to_final,
                        M.mid_top1_agreement: mid.top1_agreement, M.mid_entropy: mid.entropy,
                        M.mid_median_rank: mid.median_rank})
    if jac is not None:
        metrics.update({M.jacobian_ce: jac.ce, M.jacobian_kl_to_final: jac.kl_to_final,
                        M.jacobian_top1_agreement: jac.top1_agreement})
    below = np.nonzero(res.kl_to_final < 1.0)[0]
    mid_note = "decoded" if mid is not None else (
        "not requested" if not config.resid_mid else
        f"absent in this family: {inputs.card.absent.get('resid_mid', 'not mapped')}")
    summary = {S.last_layer_max_abs_logit_diff: diff, S.last_layer_logit_scale: logit_scale, S.bootstrap_unit: unit, S.final_ce: float(res.ce[-1]),
               S.first_layer_ce: float(res.ce[0]), S.n_scored_tokens: res.n_scored,
               S.layer_kl_below_1: int(layers[below[0]]) if below.size else None,
               S.layer_top1_agreement_above_half: next((int(l) for l, a in zip(layers, res.top1_agreement)
                                                        if a > 0.5), None),
               S.resid_mid: mid_note, S.decode_precision: decode_precision(model),
               S.jacobian_lens: config.jacobian_lens or "none",
               S.uniform_ce: uniform_ce,
               S.n_layers_worse_than_uniform: None if uniform_ce is None else int(np.sum(res.ce > uniform_ce)),
               S.late_drop_share: late_drop_share(res.ce), S.late_drop_share_low: share_low,
               S.late_drop_share_high: share_high, **stability.record("late_drop_share", nested, nested_n)}
    n_top = topk_rows.size
    topk_ids, topk_probs = res.topk_ids[:, :n_top, :config.top_k], res.topk_probs[:, :n_top, :config.top_k]
    arrays = {A.layers: res.layers, A.token_ce: res.token_ce, A.token_rank: res.token_rank,
              A.token_top1: res.token_top1, A.token_top1_str: id_strings(model.tokenizer, res.token_top1),
              A.token_kl: res.token_kl,
              A.topk_rows: topk_rows if rows is None else rows[topk_rows], A.topk_ids: topk_ids,
              A.topk_probs: topk_probs, A.topk_str: id_strings(model.tokenizer, topk_ids),
              A.ce_by_position: ce_pos, A.position_count: pos_count,
              A.token_index: np.arange(store.n_tokens) if rows is None else rows,
              **{c: np.asarray(tok[c]) for c in ("token", "token_id", "next_token_id", "doc", "window", "pos",
                                                 "special")}}
    if mid is not None:
        arrays.update({A.mid_token_ce: mid.token_ce, A.mid_token_rank: mid.token_rank})
    if jac is not None:
        arrays.update({A.jacobian_token_ce: jac.token_ce, A.jacobian_token_rank: jac.token_rank})
    if n_grid:
        arrays.update(grid_arrays(model.tokenizer, res, mid, n_grid, config.grid_top_k, jac))
    return StudyResult(model=store.model_id, corpus=inputs.corpus, n_tokens=store.n_tokens, layers=layers,
                       metrics=metrics, summary=summary, arrays=arrays,
                       extra={"site": config.site.value, "reference": "lens of the last layer = model output",
                              "units": "nats", "rank": "0 = true token is the top-1"})


def figures(result: StudyResult, config: Config) -> dict:
    a, m, layers, model = result.arrays, result.metrics, result.layers, result.model
    # layer × position for the first window: colour = CE of the true next token, text = top-1 token
    n_top = a[A.topk_ids].shape[1]
    win = a["window"]
    first = np.nonzero(win[:n_top] == win[0])[0][: config.heatmap_positions]
    x = [f"{i}:{str(t)!r}" for i, t in enumerate(a["token"][first])]
    z = a[A.token_ce][:, first]
    top_str, top_p = a[A.topk_str][:, first, 0], a[A.topk_probs][:, first, 0]
    hover = [[f"layer {layers[i]}<br>input {x[j]}<br>top-1 {str(top_str[i, j])!r} (p={top_p[i, j]:.3f})"
              f"<br>CE {z[i, j]:.2f}" for j in range(len(first))] for i in range(len(layers))]
    heat = go.Figure(go.Heatmap(z=z, x=x, y=[str(l) for l in layers], text=top_str, texttemplate="%{text}",
                                hovertext=hover, hoverinfo="text", colorscale="Viridis_r",
                                colorbar=dict(title="CE (nats)")))
    heat.update_layout(title=f"Logit lens, first window — {model} (cell text: top-1 token; colour: CE of the true "
                             "next token)", xaxis_title="input token (position: text)",
                       yaxis_title=RESULT.axis(result).title, template="plotly_white",
                       height=max(450, 22 * len(layers)))
    met = go.Figure()
    for name, key in (("CE", M.ce), ("KL to final", M.kl_to_final), ("entropy", M.entropy)):
        met.add_trace(go.Scatter(x=list(layers), y=m[key], mode="lines+markers",
                                 name=f"{name} ({result.extra['site']})"))
    if M.mid_ce in m:
        met.add_trace(go.Scatter(x=list(layers), y=m[M.mid_ce], mode="lines+markers", name="CE (resid_mid)",
                                 line=dict(dash="dot")))
    met.add_trace(go.Scatter(x=list(layers), y=m[M.top1_agreement], mode="lines+markers", yaxis="y2",
                             name="top-1 agreement with last layer", line=dict(dash="dash")))
    if result.summary.get(S.uniform_ce):
        met.add_hline(y=result.summary[S.uniform_ce], line_dash="dot", line_color="grey",
                      annotation_text="uniform over the vocabulary (ln V)")
    met.update_layout(title=f"Logit lens per layer — {model}", xaxis_title=RESULT.axis(result).title, yaxis_title="nats",
                      yaxis2=dict(title="agreement", overlaying="y", side="right", range=[0, 1]),
                      template="plotly_white", hovermode="x unified")
    ce_pos, n_pos = a[A.ce_by_position], config.heatmap_positions
    pos = go.Figure(go.Heatmap(z=ce_pos[:, :n_pos], x=list(range(min(n_pos, ce_pos.shape[1]))),
                               y=[str(l) for l in layers], colorscale="Viridis_r", colorbar=dict(title="CE")))
    pos.update_layout(title=f"Logit-lens CE by layer and position in window — {model}",
                      xaxis_title="position", yaxis_title=RESULT.axis(result).title, template="plotly_white")
    return {"main": heat, "metrics": met, "positions": pos}


STUDY = Study(
    cost=110, worker_group="store-lens",  # 111.5 s in make demo (2026-12-05)
    needs_all_positions="it re-runs whole windows from the token table to check the last layer, and reports "
                        "loss by position",
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
