"""Study: delete one block or swap two adjacent blocks, without fine-tuning (Lad, Gurnee & Tegmark
2024, "The Remarkable Robustness of LLMs: Stages of Inference?", which reports 72–95% of the
next-token accuracy retained, except at the first and last layers).

Text: the token table of ``--store`` when one is given, else the corpus cut into windows exactly as
a capture would (``seq_len``, ``max_tokens``); no activations are needed. Every variant runs the
model, so the text is ``sample_tokens`` tokens (default 1280, ten windows: the smallest sample whose interval of the
judged inner-layer mean reached its declared ±0.05 on SmolLM2, declaration.PRECISION; 0 = all) in whole windows drawn
at random: the variants are compared on the same tokens. For every layer l (:mod:`lens.interventions.ablation`): block l deleted, and blocks l, l+1
swapped (none after the last layer). ``*_inner`` summaries leave the first and last layer out.

Judged (issue #37): the paper's 72–95% is a per-model average over the intervened layers, so the claims
are judged on the MEAN retained accuracy over the inner layers (delete: blocks 1..L-2; swap: pairs (1, 2) ..
(L-3, L-2), no swap touching the first or last block), delete and swap apart, each with a 95% interval
that resamples documents (windows when there are fewer than 10 documents: :func:`studies.core.sampling.split_units`)
— per resample the ratio Σ correct of the variants (averaged over inner layers) / Σ correct of the intact
model — and its value on nested subsamples (:mod:`studies.core.stability`). The minimum over inner layers stays
as a stricter headline, not the verdict.

A variant changes nothing before block l, so each batch is run once with every block's input
recorded, and each variant runs only blocks l.. from there, many variants per block call
(:mod:`lens.interventions.replay`; the same numbers as a whole forward pass per variant, which remains the
fallback for a family whose blocks do not replay).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens.errors import LensInputError
from studies.core.config import StudyConfig, require_budget
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core.sampling import pick_windows, split_units, window_bounds
from studies.layer_ablation.declaration import A, CLAIMS, HEADLINES, M, RESULT, S
from lens.runtime.precision import describe_precision, forward_precision, resolve_precision
import lens
from lens.text.corpora import make_windows
from studies.core import stability
from studies.core.stats import bootstrap_group_means
from lens.interventions.ablation import ablation_scan


@dataclass(frozen=True)
class Config(StudyConfig):
    """``swap``: also swap adjacent blocks; ``min_tokens``: scored tokens needed at least;
    ``sample_tokens``: tokens scored per variant, whole windows drawn at random (0 = all); ``n_boot``:
    resamples of documents (or windows) for the intervals of the inner-layer means;
    ``precision`` of the forward passes (intact and every variant alike): "auto" (bfloat16 matrix
    products with float32 accumulation where the CPU multiplies bfloat16 natively), "float32" or
    "bfloat16" (:func:`lens.runtime.precision.matmul_precision`)."""

    swap: bool = True
    min_tokens: int = 32
    sample_tokens: int = 1280
    n_boot: int = 1000
    precision: str = "auto"


def check(config: Config) -> None:
    require_budget("layer-ablation", "sample_tokens", config.sample_tokens)
    if config.n_boot < 1:
        raise LensInputError(f"n_boot: expected at least 1 resample, got {config.n_boot}")
    resolve_precision(config.precision, config.device)


def needs(config: Config) -> Needs:
    return Needs(model=True, lm_head=True, tokens=True)


def text_windows(config: Config, inputs: Inputs):
    """(windows of token ids, their next-token targets, each window's document) from the store's token table
    or the corpus."""
    if inputs.store is not None:
        tok = inputs.store.tokens
        ids, nt, doc = np.asarray(tok["token_id"]), np.asarray(tok["next_token_id"]), np.asarray(tok["doc"])
        bounds = list(zip(*window_bounds(tok)))
        return [ids[a:b] for a, b in bounds], [nt[a:b] for a, b in bounds], np.array([doc[a] for a, _ in bounds])
    model = inputs.model
    w = make_windows(lens.load_corpus(config.corpus), model.tokenizer, seq_len=config.seq_len,
                     max_tokens=config.max_tokens, is_causal=inputs.card.is_causal, sample=config.sample,
                     sample_seed=config.sample_seed)
    off = w.window_offsets()
    nt, doc = w.rows["next_token_id"], np.asarray(w.rows["doc"])
    return (list(w.input_ids), [nt[off[i]:off[i + 1]] for i in range(w.n_windows)],
            np.array([doc[off[i]] for i in range(w.n_windows)]))


def inner(kind: str, values, layers, n_layers: int):
    """The entries of a per-layer scan (axis ``layer``, block ids ``layers`` of a model of ``n_layers``) on inner
    layers: block l deleted for l in 1..L-2; blocks l, l+1 swapped for l in 1..L-3 (no swap touching the first
    or the last block)."""
    layers = np.asarray(layers)
    last = n_layers - 2 if kind == "delete" else n_layers - 3
    return np.asarray(values)[(layers >= 1) & (layers <= last)]


def inner_mean_stats(r, window_doc, n_layers: int, n_boot: int, seed: int) -> dict:
    """The judged statistics: the mean retained accuracy over inner layers (delete and swap apart), its 95%
    interval resampling documents (windows when fewer than 10; the ratio Σ mean-over-layers correct / Σ intact
    correct per resample) and its value on nested subsamples of those units."""
    units, kind = split_units({"doc": np.asarray(window_doc), "window": np.arange(len(window_doc))})
    codes = np.unique(units, return_inverse=True)[1].reshape(-1)
    G = int(codes.max()) + 1 if codes.size else 0
    base = np.bincount(codes, weights=r.window_base_correct, minlength=G)
    out = {S.units: kind, S.n_units: G}
    for tag, per_window, key, low, high in (
            ("delete", r.window_correct_delete, S.retained_mean_inner_delete, S.retained_mean_inner_delete_low,
             S.retained_mean_inner_delete_high),
            ("swap", r.window_correct_swap, S.retained_mean_inner_swap, S.retained_mean_inner_swap_low,
             S.retained_mean_inner_swap_high)):
        rows = inner(tag, per_window, r.layers, n_layers)
        rows = rows[np.all(np.isfinite(rows), axis=1)] if rows.size else rows
        if not len(rows) or base.sum() <= 0:
            out.update({key: None, low: None, high: None})
            continue
        mean_correct = rows.mean(0)  # per window: correct tokens averaged over the inner layers
        sums = np.bincount(codes, weights=mean_correct, minlength=G)

        def stat(mask, w=mean_correct):
            b = float(r.window_base_correct[mask].sum())
            if b <= 0:
                raise ValueError("no correct intact token in this subsample")
            return float(w[mask].sum()) / b

        lo, hi = bootstrap_group_means(sums, base, n_boot, seed)
        out.update({key: float(sums.sum() / base.sum()), low: float(lo), high: float(hi)})
        values, _ = stability.nested_values(stat, codes, seed)
        tokens = [int(r.window_n[m].sum()) for m in stability.nested_units(codes, seed)]  # scored tokens, not windows
        out.update(stability.record(key, values, tokens))
    return out


def _range(*arrays):
    vals = np.concatenate([np.asarray(a, float) for a in arrays])
    vals = vals[np.isfinite(vals)]
    return (float(vals.min()), float(vals.max())) if vals.size else (None, None)


def compute(config: Config, inputs: Inputs) -> StudyResult:
    windows, targets, window_doc = text_windows(config, inputs)
    chosen = pick_windows([len(w) for w in windows], config.sample_tokens, config.seed)
    if chosen is not None:
        windows, targets, window_doc = [windows[i] for i in chosen], [targets[i] for i in chosen], window_doc[chosen]
    n_scored = int(sum((t >= 0).sum() for t in targets))
    if n_scored < config.min_tokens:
        raise LensInputError(f"too few tokens: {n_scored} with a known next token, expected at least "
                             f"{config.min_tokens} (raise --max-tokens)")
    with forward_precision(config.precision, inputs.model) as precision:
        r = ablation_scan(inputs.model, windows, targets, swap=config.swap, batch_size=config.batch_size,
                          progress=config.progress)
    lo, hi = _range(r.retained_accuracy_delete, r.retained_accuracy_swap)
    L = inputs.model.n_layers
    lo_in, hi_in = _range(inner("delete", r.retained_accuracy_delete, r.layers, L),
                          inner("swap", r.retained_accuracy_swap, r.layers, L))
    summary = {S.retained_min: lo, S.retained_max: hi, S.retained_min_inner: lo_in, S.retained_max_inner: hi_in,
               S.retained_min_delete: _range(r.retained_accuracy_delete)[0],
               S.retained_min_swap: _range(r.retained_accuracy_swap)[0],
               S.base_accuracy: r.base_accuracy, S.base_ce: r.base_ce, S.n_scored_tokens: r.n_tokens,
               S.precision: describe_precision(precision, inputs.model.dtype),
               **inner_mean_stats(r, window_doc, L, config.n_boot, config.seed)}
    return StudyResult(model=inputs.card.model_id, corpus=inputs.corpus, n_tokens=r.n_tokens,
                       layers=r.layers.tolist(), metrics={f.name: getattr(r, f.name) for f in M},
                       summary=summary, arrays={f.name: np.asarray(getattr(r, f.name)) for f in A},
                       extra={"swap_layer_meaning": "entry l swaps blocks l and l+1 (none for the last layer)",
                              "retained": "accuracy / intact accuracy, accuracy = top-1 equals the true next token",
                              "inner": "first and last layer left out (no swap touching either)"})


def figures(result: StudyResult, config: Config) -> dict:
    m, s, x = result.metrics, result.summary, list(result.layers)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("retained top-1 accuracy", "Δ cross-entropy (nats/token)"))
    for key, name, dash, col in (
            (M.retained_accuracy_delete, "delete block l", None, 1),
            (M.retained_accuracy_swap, "swap blocks l, l+1", None, 1),
            (M.agreement_delete, "delete: top-1 agreement with intact", "dot", 1),
            (M.agreement_swap, "swap: top-1 agreement with intact", "dot", 1),
            (M.delta_ce_delete, "Δ CE delete", None, 2), (M.delta_ce_swap, "Δ CE swap", None, 2)):
        fig.add_trace(go.Scatter(x=x, y=m[key], mode="lines" if dash else "lines+markers", name=name,
                                 line=dict(dash=dash)), 1, col)
    fig.update_xaxes(title_text="layer l")
    fig.update_yaxes(title_text="accuracy / agreement, relative to the intact model", row=1, col=1)
    fig.update_yaxes(title_text="Δ cross-entropy (nats/token)", row=1, col=2)
    fig.update_layout(title=f"Layer deletion and swap — {result.model} (intact accuracy "
                            f"{s[S.base_accuracy]:.3f}, CE {s[S.base_ce]:.3f})",
                      template="plotly_white", hovermode="x unified")
    return {"main": fig}


STUDY = Study(
    cost=85,  # 1280 tokens per variant (issue #38; 123 s at 2048)
    needs_all_positions="it re-runs the store's windows, rebuilt from its token table",
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
