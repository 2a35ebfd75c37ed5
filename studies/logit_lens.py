"""Study: the logit lens of every layer (nostalgebraist 2020) on ``resid_post`` (and ``resid_mid``).

Each layer's state is decoded through the model's own final norm and unembedding
(:mod:`lens.logit_lens`). Result metrics (one entry per layer of ``resid_post``): ``ce`` (nats per
token, true next token), ``kl_to_final`` (KL(p_final ‖ p_layer), nats), ``top1_agreement`` (with the
last layer), ``top1_accuracy``, ``entropy`` (nats), ``median_rank`` / ``mean_rank`` of the true
token (0 = top-1), and the same with prefix ``mid_`` for ``resid_mid``. Summary:
``last_layer_max_abs_logit_diff`` (the lens of the last layer against the model's logits on the
first windows, re-run), ``final_ce``, ``layer_kl_below_1``; ``ce_low`` / ``ce_high``: 95% interval
of ``ce`` with documents resampled (windows when the sample has fewer than 10 documents;
``bootstrap_unit`` says which).

Arrays for the explorer (axis names in brackets): ``token_ce`` [layer, token], ``token_rank``
[layer, token] (-1: no next token), ``token_top1`` [layer, token] (lens' top-1 id),
``token_top1_str`` [layer, token], ``token_index`` [token] (store row of each token: the decoded
tokens are whole windows drawn at random, ``lens_tokens`` of them); ``topk_rows`` [row] (store rows
of the first ``topk_tokens`` decoded tokens), ``topk_ids`` / ``topk_probs`` / ``topk_str`` [layer, row, k]; ``ce_by_position`` [layer,
position] with ``position_count`` [position]; the token table columns ``token``, ``token_id``,
``next_token_id``, ``doc``, ``window``, ``pos``, ``special`` [token].
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from lens.errors import LensInputError
from lens.logit_lens import last_layer_logit_diff, logit_lens
from studies.common import StudyConfig, prepare
from studies.lens_support import finite_or_none, group_bootstrap_mean, id_strings, lens_model, sample_windows, site_states, text_mask
from studies.prediction_gains import split_units
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "logit-lens"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``chunk_size``: tokens decoded at once (memory ≈ a few × chunk_size × d_vocab floats);
    ``top_k``: tokens kept per state for the explorer, for the first ``topk_tokens`` tokens;
    ``resid_mid``: also decode the states after attention; ``check_windows``: windows re-run to
    compare the last layer's lens with the model's logits; ``lens_tokens``: tokens decoded, whole
    windows drawn at random from the store (0 = every token) — decoding costs tokens × layers ×
    d_model × d_vocab (35 TFLOP for 20k tokens of SmolLM2, twice with ``resid_mid``), while the
    per-layer means settle long before: their bootstrap intervals are in the result."""

    chunk_size: int = 512
    lens_tokens: int = 4096
    top_k: int = 10
    topk_tokens: int = 256
    resid_mid: bool = True
    drop_special: bool = True
    check_windows: int = 2
    heatmap_positions: int = 48


def by_position(token_ce: np.ndarray, pos: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean CE per (layer, position in window) over the ``keep`` tokens."""
    P = int(pos.max()) + 1 if pos.size else 0
    sums = np.zeros((token_ce.shape[0], P))
    count = np.bincount(pos[keep], minlength=P)
    for i in range(token_ce.shape[0]):
        sums[i] = np.bincount(pos[keep], weights=token_ce[i, keep], minlength=P)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sums / count).astype(np.float32), count


def figures(res, mid, layers, tok_text, top_str, rows, model: str, ce_pos, n_pos: int) -> dict:
    # layer × position for the first window: colour = CE of the true next token, text = top-1 token
    L = len(layers)
    x = [f"{i}:{t!r}" for i, t in enumerate(tok_text[rows])]
    z = res.token_ce[:, rows]
    hover = [[f"layer {layers[i]}<br>input {x[j]}<br>top-1 {top_str[i, j]!r} (p={res.topk_probs_first[i, j]:.3f})"
              f"<br>CE {z[i, j]:.2f}" for j in range(len(rows))] for i in range(L)]
    heat = go.Figure(go.Heatmap(z=z, x=x, y=[str(l) for l in layers], text=top_str, texttemplate="%{text}",
                                hovertext=hover, hoverinfo="text", colorscale="Viridis_r",
                                colorbar=dict(title="CE (nats)")))
    heat.update_layout(title=f"Logit lens, first window — {model} (cell text: top-1 token; colour: CE of the true next token)",
                       xaxis_title="input token (position: text)", yaxis_title="layer (resid_post)",
                       template="plotly_white", height=max(450, 22 * L))
    met = go.Figure()
    for name, vals in (("CE", res.ce), ("KL to final", res.kl_to_final), ("entropy", res.entropy)):
        met.add_trace(go.Scatter(x=list(layers), y=vals, mode="lines+markers", name=f"{name} (resid_post)"))
    if mid is not None:
        met.add_trace(go.Scatter(x=list(layers), y=mid.ce, mode="lines+markers", name="CE (resid_mid)",
                                 line=dict(dash="dot")))
    met.add_trace(go.Scatter(x=list(layers), y=res.top1_agreement, mode="lines+markers", yaxis="y2",
                             name="top-1 agreement with last layer", line=dict(dash="dash")))
    met.update_layout(title=f"Logit lens per layer — {model}", xaxis_title="layer", yaxis_title="nats",
                      yaxis2=dict(title="agreement", overlaying="y", side="right", range=[0, 1]),
                      template="plotly_white", hovermode="x unified")
    pos = go.Figure(go.Heatmap(z=ce_pos[:, :n_pos], x=list(range(min(n_pos, ce_pos.shape[1]))),
                               y=[str(l) for l in layers], colorscale="Viridis_r", colorbar=dict(title="CE")))
    pos.update_layout(title=f"Logit-lens CE by layer and position in window — {model}",
                      xaxis_title="position", yaxis_title="layer", template="plotly_white")
    return {"main": heat, "metrics": met, "positions": pos}


class _View:
    """The lens result plus the first window's top-1 probabilities, for the figure."""

    def __init__(self, res, rows_in_topk):
        self.__dict__.update(res.__dict__)
        self.topk_probs_first = res.topk_probs[:, rows_in_topk, 0]


def run(config: Config, out_dir) -> Path:
    t0 = time.time()
    if config.lens_tokens < 0:
        raise LensInputError(f"{STUDY}: lens_tokens must be >= 0 (0 = all tokens); got {config.lens_tokens}")
    model = lens_model(config, STUDY)
    sites = ["resid_post"] + (["resid_mid"] if config.resid_mid else [])
    _, store = prepare(config, sites=sites)
    L = model.n_layers
    rows = sample_windows(store, config.lens_tokens, config.seed)
    sel = slice(None) if rows is None else rows
    tok = {c: np.asarray(v)[sel] for c, v in store.tokens.items()}
    nt = tok["next_token_id"]
    mask = text_mask(store, config.drop_special)[sel]
    states = site_states(store, "resid_post", L, rows)
    final = states[L - 1]
    n = len(nt)
    topk_rows = np.arange(min(config.topk_tokens, n))
    res = logit_lens(model, states, final, nt, mask=mask, chunk_size=config.chunk_size, top_k=config.top_k,
                     topk_rows=topk_rows, progress=config.progress)
    diff = last_layer_logit_diff(model, final, tok["token_id"], tok["window"], max_windows=config.check_windows)
    del states
    mid = None
    if config.resid_mid:
        mid = logit_lens(model, site_states(store, "resid_mid", L, rows), final, nt, mask=mask,
                         chunk_size=config.chunk_size, top_k=1, progress=config.progress)
    layers = res.layers.tolist()
    pos = np.asarray(tok["pos"])
    keep = mask & (nt >= 0)
    ce_pos, pos_count = by_position(np.nan_to_num(res.token_ce), pos, keep)
    top_str = id_strings(model.tokenizer, res.topk_ids)
    top1_str = id_strings(model.tokenizer, res.token_top1)
    win = np.asarray(tok["window"])
    first = np.nonzero(win[topk_rows] == win[0])[0][: config.heatmap_positions]

    # resample documents when there are enough of them, else windows (as prediction-gains splits)
    groups, unit = split_units(tok, "auto", 10)
    ce_low, ce_high = group_bootstrap_mean(np.where(mask[None, :], res.token_ce, np.nan), groups, seed=config.seed)
    metrics = {"ce": res.ce, "ce_low": ce_low, "ce_high": ce_high, "kl_to_final": res.kl_to_final, "top1_agreement": res.top1_agreement,
               "top1_accuracy": res.top1_accuracy, "entropy": res.entropy, "median_rank": res.median_rank,
               "mean_rank": res.mean_rank}
    if mid is not None:
        metrics.update({"mid_ce": mid.ce, "mid_kl_to_final": mid.kl_to_final,
                        "mid_top1_agreement": mid.top1_agreement, "mid_entropy": mid.entropy,
                        "mid_median_rank": mid.median_rank})
    metrics = {k: finite_or_none(v) for k, v in metrics.items()}
    below = np.nonzero(res.kl_to_final < 1.0)[0]
    summary = {"last_layer_max_abs_logit_diff": diff, "bootstrap_unit": unit, "final_ce": float(res.ce[-1]),
               "first_layer_ce": float(res.ce[0]), "n_scored_tokens": res.n_scored,
               "layer_kl_below_1": int(layers[below[0]]) if below.size else None,
               "layer_top1_agreement_above_half": next((int(l) for l, a in zip(layers, res.top1_agreement) if a > 0.5), None)}
    arrays = {"layers": res.layers, "token_ce": res.token_ce, "token_rank": res.token_rank,
              "token_top1": res.token_top1, "token_top1_str": top1_str, "token_kl": res.token_kl,
              "topk_rows": res.topk_rows if rows is None else rows[res.topk_rows], "topk_ids": res.topk_ids, "topk_probs": res.topk_probs, "topk_str": top_str,
              "ce_by_position": ce_pos, "position_count": pos_count,
              "token_index": np.arange(store.n_tokens) if rows is None else rows,
              **{c: np.asarray(tok[c]) for c in ("token", "token_id", "next_token_id", "doc", "window", "pos", "special")}}
    if mid is not None:
        arrays.update(mid_token_ce=mid.token_ce, mid_token_rank=mid.token_rank)
    figs = figures(_View(res, first), mid, layers, np.asarray(tok["token"]), top_str[:, first, 0], first,
                   config.model, ce_pos, config.heatmap_positions)
    return write_result(out_dir, study=STUDY, model=config.model, corpus=config.corpus, n_tokens=store.n_tokens,
                        config=config, layers=layers, metrics=metrics, summary=summary, arrays=arrays,
                        figures=figs, wall_time_s=time.time() - t0,
                        extra={"site": "resid_post", "reference": "lens of the last layer = model output",
                               "units": "nats", "rank": "0 = true token is the top-1"})
