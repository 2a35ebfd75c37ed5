"""Study: delete one block or swap two adjacent blocks, without fine-tuning (Lad, Gurnee & Tegmark
2024, "The Remarkable Robustness of LLMs: Stages of Inference?", which reports 72–95% of the
next-token accuracy retained, except at the first and last layers).

Text: the corpus cut into windows exactly as a capture would (``seq_len``, ``max_tokens``), or the
token table of ``--store`` when one is given; no activations are needed. Every variant re-runs the
model, so the text is ``eval_tokens`` tokens (default 2048; 0 = all) in whole windows drawn at random:
the variants are compared on the same tokens, and 2048 put the standard error of a top-1 accuracy
near 1%. For every layer l
(:mod:`lens.interventions`): block l deleted, and blocks l, l+1 swapped (none after the last layer).
Result metrics: ``retained_accuracy_delete`` / ``retained_accuracy_swap`` (top-1 accuracy on the true
next token over the intact model's), ``delta_ce_delete`` / ``delta_ce_swap`` (nats/token),
``accuracy_*``, ``agreement_*`` (top-1 equal to the intact model's). Summary: ``retained_min``,
``retained_max`` (over deletions and swaps), the same without the first and last layer
(``retained_min_inner`` / ``retained_max_inner``), ``base_accuracy``, ``base_ce``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

import lens
from lens.errors import LensInputError
from lens.corpora import make_windows
from lens.interventions import ablation_scan
from studies.lens_support import finite_or_none, lens_model, pick_windows
from studies.common import StudyConfig
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "layer-ablation"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``swap``: also swap adjacent blocks; ``min_tokens``: scored tokens needed at least."""

    swap: bool = True
    min_tokens: int = 32
    eval_tokens: int = 2048


def text_windows(config: Config, model):
    """(windows of token ids, their next-token targets) from the store's token table or the corpus."""
    if config.store is not None and (Path(config.store) / "manifest.json").is_file():
        store = lens.open_store(config.store)
        if store.model_id != config.model:
            raise LensInputError(f"store {config.store} was captured from {store.model_id!r}, not {config.model!r}")
        win, ids, nt = (np.asarray(store.tokens[c]) for c in ("window", "token_id", "next_token_id"))
        starts = np.nonzero(np.r_[True, win[1:] != win[:-1]])[0]
        bounds = list(zip(starts, np.r_[starts[1:], win.size]))
        return [ids[a:b] for a, b in bounds], [nt[a:b] for a, b in bounds]
    w = make_windows(lens.load_corpus(config.corpus), model.tokenizer, seq_len=config.seq_len,
                     max_tokens=config.max_tokens, is_causal=model.is_causal)
    off = w.window_offsets()
    nt = w.rows["next_token_id"]
    return list(w.input_ids), [nt[off[i]:off[i + 1]] for i in range(w.n_windows)]


def figure(r, model: str):
    x = r.layers.tolist()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("retained top-1 accuracy", "Δ cross-entropy (nats/token)"))
    fig.add_trace(go.Scatter(x=x, y=r.retained_accuracy_delete, mode="lines+markers", name="delete block l"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=r.retained_accuracy_swap, mode="lines+markers", name="swap blocks l, l+1"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=r.agreement_delete, mode="lines", name="delete: top-1 agreement with intact",
                             line=dict(dash="dot")), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=r.agreement_swap, mode="lines", name="swap: top-1 agreement with intact",
                             line=dict(dash="dot")), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=r.delta_ce_delete, mode="lines+markers", name="Δ CE delete"), 1, 2)
    fig.add_trace(go.Scatter(x=x, y=r.delta_ce_swap, mode="lines+markers", name="Δ CE swap"), 1, 2)
    fig.update_xaxes(title_text="layer l")
    fig.update_layout(title=f"Layer deletion and swap — {model} (intact accuracy {r.base_accuracy:.3f}, "
                            f"CE {r.base_ce:.3f})", template="plotly_white", hovermode="x unified")
    return fig


def _range(*arrays):
    vals = np.concatenate([np.asarray(a, float) for a in arrays])
    vals = vals[np.isfinite(vals)]
    return (float(vals.min()), float(vals.max())) if vals.size else (None, None)


def run(config: Config, out_dir) -> Path:
    t0 = time.time()
    model = lens_model(config, STUDY)
    windows, targets = text_windows(config, model)
    chosen = pick_windows([len(w) for w in windows], config.eval_tokens, config.seed)
    if chosen is not None:
        windows, targets = [windows[i] for i in chosen], [targets[i] for i in chosen]
    n_scored = int(sum((t >= 0).sum() for t in targets))
    if n_scored < config.min_tokens:
        raise LensInputError(f"{STUDY}: too few tokens: {n_scored} with a known next token, expected at least "
                             f"{config.min_tokens} (raise --max-tokens)")
    r = ablation_scan(model, windows, targets, swap=config.swap, batch_size=config.batch_size,
                      progress=config.progress)
    lo, hi = _range(r.retained_accuracy_delete, r.retained_accuracy_swap)
    inner = slice(1, -1)
    lo_in, hi_in = _range(r.retained_accuracy_delete[inner], r.retained_accuracy_swap[1:-2])
    metrics = {k: finite_or_none(getattr(r, k)) for k in (
        "retained_accuracy_delete", "retained_accuracy_swap", "delta_ce_delete", "delta_ce_swap",
        "accuracy_delete", "accuracy_swap", "agreement_delete", "agreement_swap")}
    summary = {"retained_min": lo, "retained_max": hi, "retained_min_inner": lo_in, "retained_max_inner": hi_in,
               "retained_min_delete": _range(r.retained_accuracy_delete)[0],
               "retained_min_swap": _range(r.retained_accuracy_swap)[0],
               "base_accuracy": r.base_accuracy, "base_ce": r.base_ce, "n_scored_tokens": r.n_tokens}
    arrays = {k: np.asarray(v) for k, v in r.__dict__.items() if isinstance(v, np.ndarray)}
    return write_result(out_dir, study=STUDY, model=config.model, corpus=config.corpus, n_tokens=r.n_tokens,
                        config=config, layers=r.layers.tolist(), metrics=metrics, summary=summary, arrays=arrays,
                        figures={"main": figure(r, config.model)}, wall_time_s=time.time() - t0,
                        extra={"swap_layer_meaning": "entry l swaps blocks l and l+1 (none for the last layer)",
                               "retained": "accuracy / intact accuracy, accuracy = top-1 equals the true next token",
                               "inner": "first and last layer left out"})
